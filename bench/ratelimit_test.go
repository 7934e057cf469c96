package bench

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// TestRatelimitRequest reads the encoded RateLimitRequest back field by
// field, by hand: domain (1), one descriptor (2) holding one entry (1)
// of key (1) and value (2), and nothing else (hits_addend unset).
func TestRatelimitRequest(t *testing.T) {
	b := ratelimitRequest("retryd-bench", "session", "p3-42")
	type field struct {
		num protowire.Number
		typ protowire.Type
		v   []byte
	}
	fields := func(t *testing.T, b []byte) []field {
		t.Helper()
		var out []field
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 || typ != protowire.BytesType {
				t.Fatalf("tag: n=%d type=%d", n, typ)
			}
			b = b[n:]
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				t.Fatalf("field %d: %v", num, protowire.ParseError(n))
			}
			out = append(out, field{num, typ, v})
			b = b[n:]
		}
		return out
	}
	req := fields(t, b)
	if len(req) != 2 || req[0].num != 1 || string(req[0].v) != "retryd-bench" || req[1].num != 2 {
		t.Fatalf("request fields %+v", req)
	}
	desc := fields(t, req[1].v)
	if len(desc) != 1 || desc[0].num != 1 {
		t.Fatalf("descriptor fields %+v", desc)
	}
	entry := fields(t, desc[0].v)
	if len(entry) != 2 || entry[0].num != 1 || string(entry[0].v) != "session" || entry[1].num != 2 || string(entry[1].v) != "p3-42" {
		t.Fatalf("entry fields %+v", entry)
	}
}

// TestRatelimitDecision decodes hand-built RateLimitResponses.
func TestRatelimitDecision(t *testing.T) {
	// RateLimit{requests_per_unit: 100, unit: MINUTE (3)}
	limit := protowire.AppendTag(nil, 1, protowire.VarintType)
	limit = protowire.AppendVarint(limit, 100)
	limit = protowire.AppendTag(limit, 2, protowire.VarintType)
	limit = protowire.AppendVarint(limit, 3)
	status := func(code uint64, withLimit bool) []byte {
		s := protowire.AppendTag(nil, 1, protowire.VarintType)
		s = protowire.AppendVarint(s, code)
		if withLimit {
			s = protowire.AppendTag(s, 2, protowire.BytesType)
			s = protowire.AppendBytes(s, limit)
		}
		s = protowire.AppendTag(s, 3, protowire.VarintType) // limit_remaining
		s = protowire.AppendVarint(s, 99)
		return s
	}
	response := func(code uint64, st []byte) []byte {
		var r []byte
		if code != 0 {
			r = protowire.AppendTag(r, 1, protowire.VarintType)
			r = protowire.AppendVarint(r, code)
		}
		r = protowire.AppendTag(r, 2, protowire.BytesType)
		r = protowire.AppendBytes(r, st)
		// raw_body (5), which the decoder skips
		r = protowire.AppendTag(r, 5, protowire.BytesType)
		return protowire.AppendBytes(r, []byte("x"))
	}
	for _, tc := range []struct {
		name    string
		resp    []byte
		code    uint64
		wantErr string
	}{
		{"ok", response(1, status(1, true)), 1, ""},
		{"over limit", response(2, status(2, true)), 2, ""},
		{"unknown", response(0, status(0, true)), 0, "overall_code 0"},
		{"no limit matched", response(1, status(1, false)), 1, "matched no configured limit"},
		{"truncated", response(1, status(1, true))[:5], 0, "undecodable"},
	} {
		code, err := ratelimitDecision(tc.resp)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.wantErr)
		case err == nil && code != tc.code:
			t.Errorf("%s: code %d, want %d", tc.name, code, tc.code)
		}
	}
}

func TestProcNetAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:1F90":                         "127.0.0.1",
		"00000000:0000":                         "0.0.0.0",
		"0202000C:01BB":                         "12.0.2.2",
		"00000000000000000000000001000000:1F90": "::1",
		"0000000000000000FFFF00000100007F:1F90": "127.0.0.1",
	} {
		ip, ok := procNetAddr(in)
		if !ok || ip.String() != want {
			t.Errorf("procNetAddr(%q) = %v, %v; want %s", in, ip, ok, want)
		}
	}
}

// TestSmokeRatelimit runs the Redis part with envoyproxy/ratelimit
// (Config.RatelimitBin) for a moment. It runs only when
// RETRYD_BENCH_RATELIMIT_BIN names a binary of ratelimit's
// ./src/service_cmd (the harness never builds it), and needs
// redis-server and redis-benchmark. It checks calls, no errors and that
// each ratelimit call reached Redis, and makes no assertion about speed.
func TestSmokeRatelimit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs four servers")
	}
	bin := os.Getenv("RETRYD_BENCH_RATELIMIT_BIN")
	if bin == "" {
		t.Skip("RETRYD_BENCH_RATELIMIT_BIN is not set: it names an envoyproxy/ratelimit binary you built (see docs/benchmarks.md)")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("RETRYD_BENCH_RATELIMIT_BIN: %v", err)
	}
	needPrograms(t, "redis-server", "redis-benchmark")
	cfg := Config{
		Root:     moduleRoot(t),
		Duration: 300 * time.Millisecond, Warmup: 50 * time.Millisecond, Rounds: 1,
		Workers: 4, Conns: 1, Rate: 200, KeySpace: 50, Samples: 1000, RatelimitBin: bin,
	}
	results, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, r := range results {
		targets = append(targets, r.Mode+" "+r.Target)
		if r.Calls == 0 || r.RPS() <= 0 {
			t.Errorf("%s %s: no calls", r.Target, r.Mode)
		}
		if r.Errors != 0 {
			t.Errorf("%s %s: %d errors, first: %s", r.Target, r.Mode, r.Errors, r.FirstError)
		}
		if r.Target != ratelimitName {
			continue
		}
		// Each call is INCRBY and EXPIRE of its key.
		if r.Redis == nil || r.Redis.ByCommand["incrby"] < r.Calls || r.Redis.ByCommand["expire"] < r.Calls {
			t.Errorf("ratelimit: %d calls, Redis counters %+v", r.Calls, r.Redis)
		}
	}
	want := []string{"saturation retryd", "saturation grpc echo", "saturation " + retrydRedisName, "saturation " + peerName,
		"saturation " + ratelimitName, "200 rps retryd", "200 rps grpc echo", "200 rps " + retrydRedisName}
	if !slices.Equal(targets, want) {
		t.Fatalf("phases %v, want %v", targets, want)
	}
	var b strings.Builder
	if err := WriteTable(&b, cfg, results); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| saturation | 1 | ratelimit |", "ratelimit decisions/s |", "| saturation | retryd | ratelimit | 1 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	t.Log("\n" + b.String())
}
