package rlstest

// The configurations of the suite. BasicConfigYAML, ShadowModeYAML,
// WildcardYAML and ShareThresholdYAML are envoyproxy/ratelimit's own test
// configurations (test/config/basic_config.yaml, shadowmode_config.yaml,
// wildcard.yaml and share_threshold.yaml), unchanged.
const (
	// BasicConfigYAML is test/config/basic_config.yaml.
	BasicConfigYAML = `# Basic configuration for testing.
domain: test-domain
descriptors:
  # Top level key/value with no default rate limit.
  - key: key1
    value: value1
    descriptors:
      # 2nd level key only with default rate limit.
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5

      # 2nd level key/value with limit. Specific override at 2nd level.
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10

  # Top level key only with default rate limit.
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20

  # Top level key/value with limit. Specific override at 1st level.
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30

  # First level override with no limit. This effectively whitelists the value.
  - key: key2
    value: value3

  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1

  - key: key4
    rate_limit:
      name: key4_rate_limit
      unit: day
      requests_per_unit: 1

  - key: key5
    value: value5
    rate_limit:
      unit: day
      requests_per_unit: 15
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit:
          unit: day
          requests_per_unit: 25

  - key: key6
    rate_limit:
      unlimited: true

  # Top level key only with default rate limit.

  - key: key7
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 70
`

	// ShadowModeYAML is test/config/shadowmode_config.yaml.
	ShadowModeYAML = `# Basic configuration for testing.
domain: test-domain
descriptors:
  # Top level key/value with no default rate limit.
  - key: key1
    value: value1
    descriptors:
      # 2nd level key only with default rate limit.
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5

      # 2nd level key/value with limit. Specific override at 2nd level.
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10
        shadow_mode: true

  # Top level key only with default rate limit.
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
    shadow_mode: true
  # Top level key/value with limit. Specific override at 1st level.
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30
`

	// WildcardYAML is test/config/wildcard.yaml.
	WildcardYAML = `# Basic configuration for testing.
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noWild
    value: foo
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noVal
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: midWild
    value: bar*b
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: multiWild
    value: foo*bar*baz
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit:
          unit: minute
          requests_per_unit: 20
`

	// ShareThresholdYAML is test/config/share_threshold.yaml.
	ShareThresholdYAML = `# Configuration for testing share_threshold feature
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 200
  # Test case for nested descriptors with same key name at different levels
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 300
  # Test case for share_threshold with value_to_metric
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit:
          unit: minute
          requests_per_unit: 60
  # Test case for share_threshold with detailed_metric
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit:
          unit: minute
          requests_per_unit: 80
  # Test case for nested descriptors with multiple wildcards - mixed share_threshold
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit:
              unit: minute
              requests_per_unit: 120
  # Test case for nested descriptors with multiple wildcards - both with share_threshold
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - key: action
            rate_limit:
              unit: minute
              requests_per_unit: 150
  # Test case: explicit value takes precedence over wildcard with share_threshold
  - key: file
    value: test1
    rate_limit:
      unit: minute
      requests_per_unit: 50
  - key: file
    value: test*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
  # Test case: share_threshold with middle wildcard (single *)
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
  # Test case: share_threshold with multi-wildcard (multiple *)
  - key: multiroute
    value: svc*ep*rpc
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 50
  # Test case: share_threshold with middle wildcard + value_to_metric (share_threshold takes priority)
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 80
  # Test case: share_threshold with middle wildcard nested
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 60
`

	// ReplacesYAML has a limit, vip, that replaces another, api.
	ReplacesYAML = `domain: replaces
descriptors:
  - key: api
    rate_limit: {unit: minute, requests_per_unit: 10, name: api}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: user}
  - key: vip
    rate_limit:
      unit: minute
      requests_per_unit: 100
      name: vip
      replaces:
        - name: api
`

	// CollideYAML gives each (a, b) pair of values a bucket of 2 a minute.
	CollideYAML = `domain: collide
descriptors:
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 2}
`

	// ZeroYAML has a limit of 0, one of 3 a minute and an unlimited entry.
	ZeroYAML = `domain: zero
descriptors:
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: free
    rate_limit: {unlimited: true}
`
)
