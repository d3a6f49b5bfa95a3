module github.com/tokenshard/tokenshard/stress

go 1.26.0

replace github.com/tokenshard/tokenshard => ..

replace github.com/tokenshard/tokenshard/engine/redisstore => ../engine/redisstore

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/jedib0t/go-pretty/v6 v6.9.2
	github.com/redis/go-redis/v9 v9.24.0
	github.com/stretchr/testify v1.12.1
	github.com/tokenshard/tokenshard v0.0.0-00010101000000-000000000000
	github.com/tokenshard/tokenshard/engine/redisstore v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dchest/siphash v1.2.3 // indirect
	github.com/mattn/go-runewidth v0.0.16 // indirect
	github.com/rivo/uniseg v0.4.7 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/term v0.47.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)
