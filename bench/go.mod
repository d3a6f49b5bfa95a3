module github.com/tokenshard/tokenshard/bench

go 1.26.0

replace github.com/tokenshard/tokenshard => ..

replace github.com/tokenshard/tokenshard/engine/redisstore => ../engine/redisstore

replace github.com/tokenshard/tokenshard/engine/envoyrls => ../engine/envoyrls

require (
	github.com/HdrHistogram/hdrhistogram-go v1.4.0
	github.com/envoyproxy/go-control-plane/envoy v1.40.0
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/jedib0t/go-pretty/v6 v6.9.2
	github.com/redis/go-redis/v9 v9.24.0
	github.com/sethvargo/go-limiter v0.7.1
	github.com/tokenshard/tokenshard v0.0.0-00010101000000-000000000000
	github.com/tokenshard/tokenshard/engine/envoyrls v0.0.0-00010101000000-000000000000
	github.com/tokenshard/tokenshard/engine/redisstore v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	golang.org/x/time v0.15.0
	google.golang.org/grpc v1.85.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/cncf/xds/go v0.0.0-20260202195803-dba9d589def2 // indirect
	github.com/dchest/siphash v1.2.3 // indirect
	github.com/envoyproxy/protoc-gen-validate v1.3.3 // indirect
	github.com/mattn/go-runewidth v0.0.16 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
	github.com/rivo/uniseg v0.4.7 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
