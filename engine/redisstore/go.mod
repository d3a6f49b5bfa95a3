module github.com/tokenshard/tokenshard/engine/redisstore

go 1.26.0

replace github.com/tokenshard/tokenshard => ../..

require (
	github.com/dchest/siphash v1.2.3
	github.com/redis/go-redis/v9 v9.24.0
	github.com/stretchr/testify v1.12.1
	github.com/tokenshard/tokenshard v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
