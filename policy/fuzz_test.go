package policy

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// Bits of FuzzResolve's present argument: which optional fields are set.
const (
	hasMaxRetries = 1 << iota
	hasBackoff
	hasInitial
	hasMaxDelay
	hasMultiplier
	hasJitterRatio
	hasTail
	hasMinAttempt
)

// fuzzPolicy builds a RetryPolicy from FuzzResolve's arguments. codes is a
// comma-separated list ("" means none); schedule is a comma-separated list
// of numbers (entries that do not parse become 0).
func fuzzPolicy(mode int32, present uint8, maxRetries uint32, codes string,
	initial, maxDelay uint64, multiplier, jitterRatio float64, jitter int32,
	schedule string, tail uint64, overCap int32, minAttempt uint64,
) *retrydv1.RetryPolicy {
	p := &retrydv1.RetryPolicy{
		Mode:              retrydv1.Mode(mode),
		RetryAfterOverCap: retrydv1.RetryAfterOverCap(overCap),
	}
	if present&hasMaxRetries != 0 {
		p.MaxRetries = &maxRetries
	}
	if codes != "" {
		p.RetryableCodes = strings.Split(codes, ",")
	}
	if present&(hasBackoff|hasInitial|hasMaxDelay|hasMultiplier|hasJitterRatio) != 0 || jitter != 0 {
		b := &retrydv1.Backoff{Jitter: retrydv1.Jitter(jitter)}
		if present&hasInitial != 0 {
			b.InitialDelayMs = &initial
		}
		if present&hasMaxDelay != 0 {
			b.MaxDelayMs = &maxDelay
		}
		if present&hasMultiplier != 0 {
			b.Multiplier = &multiplier
		}
		if present&hasJitterRatio != 0 {
			b.JitterRatio = &jitterRatio
		}
		p.Backoff = b
	}
	if schedule != "" {
		for s := range strings.SplitSeq(schedule, ",") {
			d, _ := strconv.ParseUint(s, 10, 64)
			p.Schedule = append(p.Schedule, d)
		}
	}
	if present&hasTail != 0 {
		p.TailDelayMs = &tail
	}
	if present&hasMinAttempt != 0 {
		p.MinAttemptMs = &minAttempt
	}
	return p
}

// FuzzResolve: Resolve never panics; a rejected policy is a
// *ValidationError naming at least one field; an accepted policy's
// canonical form (Proto) resolves to the same policy and key, and the order
// of its codes does not matter; and Decide on it never panics and keeps its
// delays within the policy's bounds.
func FuzzResolve(f *testing.F) {
	f.Add(int32(0), uint8(0), uint32(0), "", uint64(0), uint64(0), 0.0, 0.0, int32(0), "", uint64(0), int32(0), uint64(0))
	f.Add(int32(1), uint8(hasMaxRetries|hasInitial|hasMaxDelay|hasMultiplier|hasJitterRatio|hasMinAttempt), uint32(5),
		"SERVER,TIMEOUT,HTTP_5*", uint64(100), uint64(1000), 1.5, 0.0, int32(2), "", uint64(0), int32(3), uint64(0))
	f.Add(int32(2), uint8(hasInitial|hasMaxDelay|hasJitterRatio), uint32(0),
		"", uint64(1000), uint64(30000), 2.0, 0.2, int32(0), "", uint64(0), int32(0), uint64(100))
	f.Add(int32(3), uint8(hasTail), uint32(0),
		"HTTP_*,AUTH,QUOTA", uint64(0), uint64(0), 0.0, 0.0, int32(0), "2000,5000,5000,5000,10000", uint64(20000), int32(0), uint64(0))
	f.Add(int32(3), uint8(hasMaxRetries), uint32(3),
		"*,server,SERVER,SERVER,ABORTED", uint64(0), uint64(0), 0.0, 0.0, int32(0), "0,2147483648", uint64(0), int32(9), uint64(0))

	f.Fuzz(func(t *testing.T, mode int32, present uint8, maxRetries uint32, codes string,
		initial, maxDelay uint64, multiplier, jitterRatio float64, jitter int32,
		schedule string, tail uint64, overCap int32, minAttempt uint64,
	) {
		in := fuzzPolicy(mode, present, maxRetries, codes, initial, maxDelay, multiplier, jitterRatio, jitter,
			schedule, tail, overCap, minAttempt)
		snapshot := proto.Clone(in)
		p, err := Resolve(in)
		if !proto.Equal(in, snapshot) {
			t.Fatalf("Resolve modified its input: %v, was %v", in, snapshot)
		}
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Resolve(%v) error %v is %T, want *ValidationError", in, err, err)
			}
			if p != nil {
				t.Fatalf("Resolve(%v) returned a policy with its error", in)
			}
			if len(ve.Violations) == 0 {
				t.Fatalf("Resolve(%v): validation error without violations", in)
			}
			for _, v := range ve.Violations {
				if v.Field == "" || v.Description == "" {
					t.Fatalf("Resolve(%v): incomplete violation %+v", in, v)
				}
			}
			return
		}
		if p.Key == "" {
			t.Fatalf("Resolve(%v): empty key", in)
		}

		// Canonicalisation is stable: the explicit form resolves to itself.
		canon := p.Proto()
		again, err := Resolve(canon)
		if err != nil {
			t.Fatalf("Resolve(Proto()) of %q: %v", p.Key, err)
		}
		if again.Key != p.Key {
			t.Fatalf("Resolve(Proto()) key\n %q\nwant\n %q", again.Key, p.Key)
		}
		if !proto.Equal(again.Proto(), canon) {
			t.Fatalf("Proto() is not a fixed point:\n %v\n %v", again.Proto(), canon)
		}

		// Codes are a set: any order gives the same key.
		if len(in.RetryableCodes) > 1 {
			for _, shuffled := range [][]string{reversed(in.RetryableCodes), rotated(in.RetryableCodes)} {
				in2 := proto.Clone(in).(*retrydv1.RetryPolicy)
				in2.RetryableCodes = shuffled
				p2, err := Resolve(in2)
				if err != nil {
					t.Fatalf("codes %q accepted but %q rejected: %v", in.RetryableCodes, shuffled, err)
				}
				if p2.Key != p.Key {
					t.Fatalf("codes %q and %q give keys\n %q\n %q", in.RetryableCodes, shuffled, p.Key, p2.Key)
				}
			}
		}

		// Decide keeps its delays within the policy's bounds.
		for _, retries := range []uint32{0, 1, maxRetries % 100, 63, 64, 65} {
			for _, u := range []float64{0, 0.5, almostOne} {
				a := Attempt{Retries: retries, Code: "SERVER", Downstream: retrydv1.Downstream_DOWNSTREAM_DECLINED}
				d := p.Decide(a, now, fixedRand{u})
				if !d.Schedule {
					if d.Reason == retrydv1.DelegateReason_DELEGATE_REASON_UNSPECIFIED || d.Detail == "" {
						t.Fatalf("%q retries %d: delegation without reason or detail: %+v", p.Key, retries, d)
					}
					continue
				}
				if d.RetryNumber != retries+1 {
					t.Fatalf("%q retries %d: retry number %d", p.Key, retries, d.RetryNumber)
				}
				if d.DelayMs > p.DelayCapMs() || d.DelayMs > MaxDelayMs {
					t.Fatalf("%q retry %d: delay %d over cap %d", p.Key, d.RetryNumber, d.DelayMs, p.DelayCapMs())
				}
				if d.Source == retrydv1.DelaySource_DELAY_SOURCE_BACKOFF {
					if lo, hi := p.BackoffBounds(d.RetryNumber); d.DelayMs < lo || d.DelayMs > hi {
						t.Fatalf("%q retry %d: delay %d outside [%d, %d]", p.Key, d.RetryNumber, d.DelayMs, lo, hi)
					}
				}
			}
		}
	})
}

// rotated returns s rotated left by one.
func rotated[T any](s []T) []T {
	return append(slices.Clone(s[1:]), s[0])
}

// FuzzParseRetryAfter: ParseRetryAfter never panics, a valid finite delay
// fits the 32-bit timer, an invalid or over result carries no Ms,
// delta-seconds are exact, and ProviderRetryAfter with only a header agrees.
func FuzzParseRetryAfter(f *testing.F) {
	for _, v := range []string{
		"120", "0", "", " ", "-1", "1.5", "abc", "2147483", "2147484", "99999999999999999999",
		"Sun, 01 Mar 2026 12:02:00 GMT", "Sunday, 01-Mar-26 12:00:30 GMT", "Sun Mar  1 12:01:00 2026",
		"Sun, 06 Nov 1994 08:49:37 GMT", "Fri, 01 Jan 2100 00:00:00 GMT",
	} {
		f.Add(v, now.Unix(), int64(0))
	}
	f.Fuzz(func(t *testing.T, v string, sec, nsec int64) {
		at := time.Unix(sec, nsec)
		got := ParseRetryAfter(v, at)
		switch {
		case !got.Valid && (got.Over || got.Ms != 0):
			t.Fatalf("ParseRetryAfter(%q) = %+v: invalid but carries a delay", v, got)
		case got.Over && got.Ms != 0:
			t.Fatalf("ParseRetryAfter(%q) = %+v: over but carries Ms", v, got)
		case got.Valid && !got.Over && got.Ms > math.MaxInt32:
			t.Fatalf("ParseRetryAfter(%q) = %+v: Ms over the timer limit", v, got)
		}
		if s := strings.TrimSpace(v); s != "" && isDigits(s) {
			secs, err := strconv.ParseUint(s, 10, 64)
			want := RetryAfter{Valid: true, Over: true}
			if err == nil && secs <= math.MaxInt32/1000 {
				want = RetryAfter{Valid: true, Ms: secs * 1000}
			}
			if got != want {
				t.Fatalf("ParseRetryAfter(%q) = %+v, want %+v", v, got, want)
			}
		}
		if via := ProviderRetryAfter(nil, &v, at); via != got {
			t.Fatalf("ProviderRetryAfter(nil, %q) = %+v, ParseRetryAfter = %+v", v, via, got)
		}
		_ = got.String()
	})
}
