module github.com/tokenshard/tokenshard/engine/envoyrls/cmd/tokenshard-rls

go 1.26.0

replace github.com/tokenshard/tokenshard => ../../../..

replace github.com/tokenshard/tokenshard/engine/envoyrls => ../..

replace github.com/tokenshard/tokenshard/engine/redisstore => ../../../redisstore

replace github.com/tokenshard/tokenshard/engine/promstats => ../../../promstats

replace github.com/tokenshard/tokenshard/engine/promstats/storestats => ../../../promstats/storestats

require (
	github.com/envoyproxy/go-control-plane/envoy v1.40.0
	github.com/prometheus/client_golang v1.25.0
	github.com/redis/go-redis/v9 v9.24.0
	github.com/tokenshard/tokenshard v0.0.0-00010101000000-000000000000
	github.com/tokenshard/tokenshard/engine/envoyrls v0.0.0-00010101000000-000000000000
	github.com/tokenshard/tokenshard/engine/promstats v0.0.0-00010101000000-000000000000
	github.com/tokenshard/tokenshard/engine/promstats/storestats v0.0.0-00010101000000-000000000000
	github.com/tokenshard/tokenshard/engine/redisstore v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	golang.org/x/net v0.62.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/cncf/xds/go v0.0.0-20260202195803-dba9d589def2 // indirect
	github.com/dchest/siphash v1.2.3 // indirect
	github.com/envoyproxy/protoc-gen-validate v1.3.3 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pandatix/go-abnf v0.5.5 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.74.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)
