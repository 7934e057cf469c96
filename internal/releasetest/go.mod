module github.com/retryd/retryd/internal/releasetest

go 1.26.0

require github.com/retryd/retryd/internal/retrydtest v0.0.0-00010101000000-000000000000

require (
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
	github.com/retryd/retryd/gen v0.0.0-00010101000000-000000000000 // indirect
	github.com/retryd/retryd/invariant v0.0.0-00010101000000-000000000000 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
	google.golang.org/grpc v1.85.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

// The repository's own modules build from their working copies here. The
// replace directives apply only inside this repository: a module that
// requires this one resolves the versions required above.
replace (
	github.com/retryd/retryd/gen => ../../gen
	github.com/retryd/retryd/internal/retrydtest => ../retrydtest
	github.com/retryd/retryd/invariant => ../../invariant
)
