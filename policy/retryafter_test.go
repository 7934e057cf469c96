package policy

import (
	"math"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	invalid := RetryAfter{}
	over := RetryAfter{Valid: true, Over: true}
	wait := func(ms uint64) RetryAfter { return RetryAfter{Valid: true, Ms: ms} }

	tests := []struct {
		name  string
		value string
		now   time.Time
		want  RetryAfter
	}{
		// delta-seconds
		{"120 seconds", "120", now, wait(120000)},
		{"0 seconds", "0", now, wait(0)},
		{"1 second", "1", now, wait(1000)},
		{"leading zeros", "007", now, wait(7000)},
		{"surrounding whitespace", "  120\t\n", now, wait(120000)},
		{"largest whole seconds under the timer limit", "2147483", now, wait(2147483000)},
		{"one second over the timer limit", "2147484", now, over},
		{"one day", "86400", now, wait(86400000)},
		{"huge number", "99999999999999999999", now, over},
		{"max uint64", "18446744073709551615", now, over},
		{"many leading zeros", "0000000000000000000000000000005", now, wait(5000)},

		// malformed
		{"empty", "", now, invalid},
		{"whitespace", "   ", now, invalid},
		{"negative", "-1", now, invalid},
		{"plus sign", "+5", now, invalid},
		{"fraction", "1.5", now, invalid},
		{"exponent", "1e3", now, invalid},
		{"letters", "abc", now, invalid},
		{"trailing unit", "120s", now, invalid},
		{"inner space", "12 0", now, invalid},
		{"fullwidth digits", "１２０", now, invalid},
		{"hex", "0x10", now, invalid},

		// HTTP-date (RFC 9110: IMF-fixdate, RFC 850, asctime)
		{"IMF-fixdate 2 minutes ahead", "Sun, 01 Mar 2026 12:02:00 GMT", now, wait(120000)},
		{"IMF-fixdate rounds up a sub-millisecond rest", "Sun, 01 Mar 2026 12:02:00 GMT", now.Add(time.Nanosecond), wait(120000)},
		{"IMF-fixdate keeps whole milliseconds", "Sun, 01 Mar 2026 12:02:00 GMT", now.Add(250 * time.Millisecond), wait(119750)},
		{"IMF-fixdate rounds 0.5 ms up", "Sun, 01 Mar 2026 12:00:01 GMT", now.Add(500 * time.Microsecond), wait(1000)},
		{"IMF-fixdate 1 ns ahead is 1 ms", "Sun, 01 Mar 2026 12:00:00 GMT", now.Add(-time.Nanosecond), wait(1)},
		{"IMF-fixdate now", "Sun, 01 Mar 2026 12:00:00 GMT", now, wait(0)},
		{"IMF-fixdate in the past", "Sun, 01 Mar 2026 11:59:00 GMT", now, wait(0)},
		{"IMF-fixdate long ago", "Sun, 06 Nov 1994 08:49:37 GMT", now, wait(0)},
		{"IMF-fixdate 24 days ahead", "Wed, 25 Mar 2026 12:00:00 GMT", now, wait(24 * 86400 * 1000)},
		{"IMF-fixdate 25 days ahead is over the timer limit", "Thu, 26 Mar 2026 12:00:00 GMT", now, over},
		{"IMF-fixdate far future", "Fri, 01 Jan 2100 00:00:00 GMT", now, over},
		{"IMF-fixdate with whitespace", " Sun, 01 Mar 2026 12:00:30 GMT ", now, wait(30000)},
		{"RFC 850 date", "Sunday, 01-Mar-26 12:00:30 GMT", now, wait(30000)},
		{"RFC 850 date in the past", "Sunday, 06-Nov-94 08:49:37 GMT", now, wait(0)},
		{"asctime date", "Sun Mar  1 12:01:00 2026", now, wait(60000)},
		{"asctime date in the past", "Sun Nov  6 08:49:37 1994", now, wait(0)},
		{"now in another zone", "Sun, 01 Mar 2026 12:02:00 GMT", now.In(time.FixedZone("UTC+9", 9*3600)), wait(120000)},
		{"invalid day", "Sun, 32 Mar 2026 12:00:00 GMT", now, invalid},
		{"non-GMT zone", "Sun, 01 Mar 2026 12:02:00 PST", now, invalid},
		{"ISO 8601", "2026-03-01T12:02:00Z", now, invalid},
		{"truncated date", "Sun, 01 Mar 2026", now, invalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ParseRetryAfter(tt.value, tt.now); got != tt.want {
				t.Errorf("ParseRetryAfter(%q) = %+v, want %+v", tt.value, got, tt.want)
			}
		})
	}
}

func TestProviderRetryAfter(t *testing.T) {
	t.Parallel()
	i64 := func(v int64) *int64 { return &v }
	str := func(v string) *string { return &v }
	tests := []struct {
		name   string
		ms     *int64
		header *string
		want   RetryAfter
	}{
		{"neither", nil, nil, RetryAfter{}},
		{"ms 0", i64(0), nil, RetryAfter{Valid: true}},
		{"ms 1500", i64(1500), nil, RetryAfter{Valid: true, Ms: 1500}},
		{"ms at the timer limit", i64(maxInt32), nil, RetryAfter{Valid: true, Ms: maxInt32}},
		{"ms over the timer limit", i64(maxInt32 + 1), nil, RetryAfter{Valid: true, Over: true}},
		{"ms max int64", i64(math.MaxInt64), nil, RetryAfter{Valid: true, Over: true}},
		{"ms -1 ignored", i64(-1), nil, RetryAfter{}},
		{"ms min int64 ignored", i64(math.MinInt64), nil, RetryAfter{}},
		{"header seconds", nil, str("120"), RetryAfter{Valid: true, Ms: 120000}},
		{"header date", nil, str("Sun, 01 Mar 2026 12:00:05 GMT"), RetryAfter{Valid: true, Ms: 5000}},
		{"header malformed", nil, str("soon"), RetryAfter{}},
		{"header empty", nil, str(""), RetryAfter{}},
		{"header huge", nil, str("99999999999999999999"), RetryAfter{Valid: true, Over: true}},
		{"ms takes precedence over header", i64(1500), str("120"), RetryAfter{Valid: true, Ms: 1500}},
		{"ms 0 takes precedence over header", i64(0), str("120"), RetryAfter{Valid: true}},
		{"ms takes precedence over malformed header", i64(1500), str("soon"), RetryAfter{Valid: true, Ms: 1500}},
		{"over ms takes precedence over header", i64(maxInt32 + 1), str("1"), RetryAfter{Valid: true, Over: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ProviderRetryAfter(tt.ms, tt.header, now); got != tt.want {
				t.Errorf("ProviderRetryAfter = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRetryAfterString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ra   RetryAfter
		want string
	}{
		{RetryAfter{}, "no retry-after"},
		{RetryAfter{Valid: true}, "0 ms"},
		{RetryAfter{Valid: true, Ms: 120000}, "120000 ms"},
		{RetryAfter{Valid: true, Over: true}, "an unbounded delay"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			t.Parallel()
			if got := tt.ra.String(); got != tt.want {
				t.Errorf("%+v.String() = %q, want %q", tt.ra, got, tt.want)
			}
		})
	}
}
