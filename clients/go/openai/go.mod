module github.com/retryd/retryd/clients/go/openai

go 1.26.0

require (
	github.com/openai/openai-go/v3 v3.100.0
	github.com/retryd/retryd/clients/go v0.0.0-00010101000000-000000000000
	github.com/retryd/retryd/gen v0.0.0-00010101000000-000000000000
	github.com/retryd/retryd/internal/retrydtest v0.0.0-00010101000000-000000000000
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/sdk v1.47.0
	go.opentelemetry.io/otel/sdk/metric v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/coder/websocket v1.8.15 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
	github.com/retryd/retryd/invariant v0.0.0-00010101000000-000000000000 // indirect
	github.com/retryd/retryd/policy v0.0.0-00010101000000-000000000000 // indirect
	github.com/tidwall/gjson v1.20.0 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/tidwall/sjson v1.2.5 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc v0.72.0 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
	google.golang.org/grpc v1.85.0 // indirect
)

// The repository's own modules build from their working copies here. The
// replace directives apply only inside this repository: a module that
// requires this one resolves the versions required above.
replace (
	github.com/retryd/retryd/clients/go => ..
	github.com/retryd/retryd/gen => ../../../gen
	github.com/retryd/retryd/internal/retrydtest => ../../../internal/retrydtest
	github.com/retryd/retryd/invariant => ../../../invariant
	github.com/retryd/retryd/policy => ../../../policy
)
