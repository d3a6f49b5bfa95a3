package rlstest

// The configurations of the suite. TreeYAML, ShadowYAML, WildcardValuesYAML
// and SharedBucketsYAML between them hold every kind of entry the matcher
// tells apart; the suite's cases say which descriptor gets which limit.
const (
	// TreeYAML is a tree of plain entries: a key/value with no limit whose
	// children are a key-only default and a more specific value; a key-only
	// default beside a value with a limit of its own and a value exempt from
	// it; a limited key/value with a limited child; limits of one an hour
	// and one a day (named); an unlimited key; detailed_metric.
	TreeYAML = `# The storefront's limits.
domain: storefront
descriptors:
  # acme itself has no limit; its clients have.
  - key: tenant
    value: acme
    descriptors:
      - key: client
        value: mobile
        rate_limit: {unit: second, requests_per_unit: 8}
      # Every other client of acme.
      - key: client
        rate_limit:
          unit: second
          requests_per_unit: 4

  - key: plan
    value: gold
    rate_limit: {unit: day, requests_per_unit: 40}
    descriptors:
      - key: feature
        value: reports
        rate_limit: {unit: day, requests_per_unit: 64}

  - key: region
    value: eu-west
    rate_limit: {unit: minute, requests_per_unit: 24}
  # Named without a limit, so not held to the region default below.
  - key: region
    value: internal
  - key: region
    rate_limit:
      unit: minute
      requests_per_unit: 12

  - key: export
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: signup
    rate_limit: {name: signup_daily, unit: day, requests_per_unit: 1}
  - key: healthcheck
    rate_limit: {unlimited: true}
  - key: search
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 90}
`

	// ShadowYAML has shadow entries: a key-only default in shadow mode
	// beside an enforced value of its key, and a nested value in shadow
	// mode beside an enforced key-only default.
	ShadowYAML = `domain: checkout
descriptors:
  # Any coupon is only measured for now; the spring campaign is enforced.
  - key: coupon
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 14}
  - key: coupon
    value: spring
    rate_limit: {unit: minute, requests_per_unit: 27}
  - key: cart
    descriptors:
      - key: item
        rate_limit: {unit: second, requests_per_unit: 3}
      # Gift cards: a trial limit, reported but never refusing.
      - key: item
        value: giftcard
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 6}
`

	// WildcardValuesYAML has values with '*' at the end, in the middle,
	// twice, at the start and in a nested entry, beside an exact value and
	// a key-only entry; none shares its bucket.
	WildcardValuesYAML = `domain: catalog
descriptors:
  - key: lang
    value: en*
    rate_limit: {unit: minute, requests_per_unit: 18}
  - key: locale
    value: en
    rate_limit: {unit: minute, requests_per_unit: 16}
  - key: currency
    rate_limit: {unit: minute, requests_per_unit: 14}
  - key: object
    value: img*png
    rate_limit: {unit: minute, requests_per_unit: 22}
  - key: route
    value: /api*/users*/orders
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: host
    value: "*.example.org"
    rate_limit: {unit: minute, requests_per_unit: 11}
  - key: app
    value: shop
    descriptors:
      - key: lang
        value: fr*
        rate_limit: {unit: minute, requests_per_unit: 26}
`

	// SharedBucketsYAML has share_threshold wildcards: at the top, nested,
	// on one key at two levels, beside an exact value of the same key, above
	// a wildcard that does not share and above one that does, with
	// value_to_metric and detailed_metric, and with '*' inside the value.
	SharedBucketsYAML = `domain: media
descriptors:
  # Every image path shares one bucket.
  - key: asset
    value: img/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 45}
  # The same key one level down, under a shared wildcard of its own.
  - key: asset
    value: raw/*
    share_threshold: true
    descriptors:
      - key: asset
        value: crops/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 90}
  - key: album
    value: summer
    descriptors:
      - key: asset
        value: thumbs/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 72}
  # Every sku starting with A shares one bucket, but A100 has its own.
  - key: sku
    value: A*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 66}
  - key: sku
    value: A100
    rate_limit: {unit: minute, requests_per_unit: 32}
  # Shared organisations, a bucket per project, a bucket per kind.
  - key: org
    value: org-*
    share_threshold: true
    descriptors:
      - key: project
        value: proj-*
        share_threshold: false
        descriptors:
          - key: kind
            rate_limit: {unit: minute, requests_per_unit: 48}
  # Shared at both wildcard levels.
  - key: account
    value: acct-*
    share_threshold: true
    descriptors:
      - key: volume
        value: vol-*
        share_threshold: true
        descriptors:
          - key: op
            rate_limit: {unit: minute, requests_per_unit: 65}
  - key: endpoint
    value: v1/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: verb
        rate_limit: {unit: minute, requests_per_unit: 35}
  - key: team
    value: team-*
    share_threshold: true
    descriptors:
      - key: handler
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 55}
  # '*' inside the value: once, twice, once with value_to_metric, and at
  # two levels.
  - key: docpath
    value: /docs*index
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 75}
  - key: rpc
    value: grpc*svc*call
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 33}
  - key: apiver
    value: /v*beta
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 85}
  - key: zone
    value: z*east
    share_threshold: true
    descriptors:
      - key: rack
        value: r*a
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 28}
`

	// ReplacesYAML has a limit, vip, that replaces another, api, and
	// names an unlimited one, free.
	ReplacesYAML = `domain: replaces
descriptors:
  - key: api
    rate_limit: {unit: minute, requests_per_unit: 10, name: api}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: user}
  - key: free
    rate_limit: {unlimited: true, name: free}
  - key: vip
    rate_limit:
      unit: minute
      requests_per_unit: 96
      name: vip
      replaces:
        - name: api
        - name: free
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
