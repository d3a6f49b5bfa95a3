module github.com/tokenshard/tokenshard/engine/promstats/storestats

go 1.26.0

replace github.com/tokenshard/tokenshard => ../../..

replace github.com/tokenshard/tokenshard/engine/promstats => ../../../engine/promstats

replace github.com/tokenshard/tokenshard/engine/redisstore => ../../../engine/redisstore

require (
	github.com/prometheus/client_golang v1.25.0
	github.com/prometheus/client_model v0.6.3
	github.com/redis/go-redis/v9 v9.24.0
	github.com/stretchr/testify v1.12.1
	github.com/tokenshard/tokenshard v0.0.0-00010101000000-000000000000
	github.com/tokenshard/tokenshard/engine/promstats v0.0.0-00010101000000-000000000000
	github.com/tokenshard/tokenshard/engine/redisstore v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dchest/siphash v1.2.3 // indirect
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pandatix/go-abnf v0.5.5 // indirect
	github.com/prometheus/common v0.74.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.50.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
