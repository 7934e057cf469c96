package policy

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// Shorthands for building RetryPolicy messages in tables.
const (
	normal   = retrydv1.Mode_MODE_NORMAL
	always   = retrydv1.Mode_MODE_ALWAYS
	schedule = retrydv1.Mode_MODE_SCHEDULE

	symmetric = retrydv1.Jitter_JITTER_SYMMETRIC
	full      = retrydv1.Jitter_JITTER_FULL

	overCapDelegate = retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_DELEGATE
	overCapLocal    = retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_LOCAL
	overCapHonor    = retrydv1.RetryAfterOverCap_RETRY_AFTER_OVER_CAP_HONOR
)

const maxInt32 = math.MaxInt32

func u32(v uint32) *uint32   { return &v }
func u64(v uint64) *uint64   { return &v }
func f64(v float64) *float64 { return &v }

// Keys of the three default policies, spelled out from the documented
// numbers (dsh-llm-retry README, dsh-retry article).
const (
	keyNormalDefault = "normal;max=2;codes=EMPTY_RESPONSE,RATE_LIMIT,SERVER,TIMEOUT,TRANSPORT;" +
		"backoff=500..10000*2;jitter=symmetric:0.1;over_cap=delegate;min_attempt=100"
	keyAlwaysDefault   = "always;max=inf;backoff=500..10000*2;jitter=symmetric:0.1;over_cap=local;min_attempt=100"
	keyScheduleDefault = "schedule;max=inf;codes=ACCOUNT_QUOTA,ACCOUNT_TOKEN_INVALID,AUTH,EMPTY_RESPONSE,HTTP_*," +
		"INVALID_CREDENTIAL,MALFORMED_RESPONSE,PI_AI_ERROR,QUOTA,RATE_LIMIT,SERVER,TIMEOUT,TRANSPORT;" +
		"schedule=2000,5000,5000,5000,10000;tail=20000;over_cap=local;min_attempt=100"
)

// mustResolve resolves p and fails the test on a validation error.
func mustResolve(t testing.TB, p *retrydv1.RetryPolicy) *Policy {
	t.Helper()
	got, err := Resolve(p)
	if err != nil {
		t.Fatalf("Resolve(%v): %v", p, err)
	}
	return got
}

// distinctCodes returns n distinct valid codes (n <= 676).
func distinctCodes(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "CODE_" + string(rune('A'+i/26)) + string(rune('A'+i%26))
	}
	return out
}

// reversed returns a reversed copy of s.
func reversed[T any](s []T) []T {
	out := slices.Clone(s)
	slices.Reverse(out)
	return out
}

// exported is p without its unexported lookup tables, for comparison with
// reflect.DeepEqual.
func exported(p *Policy) Policy {
	out := *p
	out.exact, out.prefixes, out.shared = nil, nil, nil
	return out
}

func TestSharedProtoEqualsProto(t *testing.T) {
	t.Parallel()
	for _, in := range []*retrydv1.RetryPolicy{nil, {Mode: retrydv1.Mode_MODE_ALWAYS}, {Mode: retrydv1.Mode_MODE_SCHEDULE, MaxRetries: u32(3)}} {
		p := mustResolve(t, in)
		if !proto.Equal(p.SharedProto(), p.Proto()) || p.SharedProto() != p.SharedProto() {
			t.Errorf("SharedProto of %v: %v, want one message equal to Proto() %v", in, p.SharedProto(), p.Proto())
		}
	}
}

func TestResolveDefaults(t *testing.T) {
	t.Parallel()
	normalDefault := Policy{
		Mode:           normal,
		MaxRetries:     2,
		Bounded:        true,
		Codes:          []string{"EMPTY_RESPONSE", "RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT"},
		InitialDelayMs: 500,
		MaxDelayMs:     10000,
		Multiplier:     2,
		JitterRatio:    0.1,
		Jitter:         symmetric,
		OverCap:        overCapDelegate,
		MinAttemptMs:   100,
		Key:            keyNormalDefault,
	}
	alwaysDefault := Policy{
		Mode:           always,
		InitialDelayMs: 500,
		MaxDelayMs:     10000,
		Multiplier:     2,
		JitterRatio:    0.1,
		Jitter:         symmetric,
		OverCap:        overCapLocal,
		MinAttemptMs:   100,
		Key:            keyAlwaysDefault,
	}
	scheduleDefault := Policy{
		Mode: schedule,
		Codes: []string{
			"ACCOUNT_QUOTA", "ACCOUNT_TOKEN_INVALID", "AUTH", "EMPTY_RESPONSE", "HTTP_*",
			"INVALID_CREDENTIAL", "MALFORMED_RESPONSE", "PI_AI_ERROR", "QUOTA", "RATE_LIMIT",
			"SERVER", "TIMEOUT", "TRANSPORT",
		},
		Schedule:     []uint64{2000, 5000, 5000, 5000, 10000},
		TailDelayMs:  20000,
		OverCap:      overCapLocal,
		MinAttemptMs: 100,
		Key:          keyScheduleDefault,
	}
	scheduleBounded := scheduleDefault
	scheduleBounded.Bounded, scheduleBounded.MaxRetries = true, 5
	scheduleBounded.Key = strings.Replace(keyScheduleDefault, "max=inf", "max=5", 1)

	tests := []struct {
		name   string
		policy *retrydv1.RetryPolicy
		want   Policy
	}{
		{"nil", nil, normalDefault},
		{"empty", &retrydv1.RetryPolicy{}, normalDefault},
		{"mode normal", &retrydv1.RetryPolicy{Mode: normal}, normalDefault},
		{"empty backoff", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{}}, normalDefault},
		{"normal with every default explicit", &retrydv1.RetryPolicy{
			Mode:           normal,
			MaxRetries:     u32(2),
			RetryableCodes: []string{"TRANSPORT", "TIMEOUT", "SERVER", "RATE_LIMIT", "EMPTY_RESPONSE"},
			Backoff: &retrydv1.Backoff{
				InitialDelayMs: u64(500), MaxDelayMs: u64(10000), Multiplier: f64(2),
				JitterRatio: f64(0.1), Jitter: symmetric,
			},
			RetryAfterOverCap: overCapDelegate,
			MinAttemptMs:      u64(100),
		}, normalDefault},
		{"always", &retrydv1.RetryPolicy{Mode: always}, alwaysDefault},
		{"always with every default explicit", &retrydv1.RetryPolicy{
			Mode: always,
			Backoff: &retrydv1.Backoff{
				InitialDelayMs: u64(500), MaxDelayMs: u64(10000), Multiplier: f64(2),
				JitterRatio: f64(0.1), Jitter: symmetric,
			},
			RetryAfterOverCap: overCapLocal,
			MinAttemptMs:      u64(100),
		}, alwaysDefault},
		{"schedule", &retrydv1.RetryPolicy{Mode: schedule}, scheduleDefault},
		{"schedule with every default explicit", &retrydv1.RetryPolicy{
			Mode:              schedule,
			RetryableCodes:    slices.Clone(DefaultScheduleCodes),
			Schedule:          []uint64{2000, 5000, 5000, 5000, 10000},
			TailDelayMs:       u64(20000),
			RetryAfterOverCap: overCapLocal,
			MinAttemptMs:      u64(100),
		}, scheduleDefault},
		{"schedule with max_retries", &retrydv1.RetryPolicy{Mode: schedule, MaxRetries: u32(5)}, scheduleBounded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := exported(mustResolve(t, tt.policy))
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Resolve(%v)\n got %+v\nwant %+v", tt.policy, got, tt.want)
			}
		})
	}
}

func TestResolveOverrides(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		policy *retrydv1.RetryPolicy
		check  func(*Policy) bool
	}{
		{"normal max_retries 0 is kept", &retrydv1.RetryPolicy{MaxRetries: u32(0)},
			func(p *Policy) bool { return p.Bounded && p.MaxRetries == 0 }},
		{"normal max_retries 7", &retrydv1.RetryPolicy{MaxRetries: u32(7)},
			func(p *Policy) bool { return p.Bounded && p.MaxRetries == 7 }},
		{"normal codes are sorted", &retrydv1.RetryPolicy{RetryableCodes: []string{"TIMEOUT", "HTTP_5*", "AUTH"}},
			func(p *Policy) bool { return slices.Equal(p.Codes, []string{"AUTH", "HTTP_5*", "TIMEOUT"}) }},
		{"full jitter", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Jitter: full}},
			func(p *Policy) bool { return p.Jitter == full && p.JitterRatio == 0.1 }},
		{"always over-cap honor", &retrydv1.RetryPolicy{Mode: always, RetryAfterOverCap: overCapHonor},
			func(p *Policy) bool { return p.OverCap == overCapHonor }},
		{"normal over-cap local", &retrydv1.RetryPolicy{RetryAfterOverCap: overCapLocal},
			func(p *Policy) bool { return p.OverCap == overCapLocal }},
		{"schedule over-cap delegate", &retrydv1.RetryPolicy{Mode: schedule, RetryAfterOverCap: overCapDelegate},
			func(p *Policy) bool { return p.OverCap == overCapDelegate }},
		{"min_attempt 0", &retrydv1.RetryPolicy{MinAttemptMs: u64(0)},
			func(p *Policy) bool { return p.MinAttemptMs == 0 }},
		{"custom schedule keeps its order", &retrydv1.RetryPolicy{Mode: schedule, Schedule: []uint64{9000, 1000}, TailDelayMs: u64(3000)},
			func(p *Policy) bool { return slices.Equal(p.Schedule, []uint64{9000, 1000}) && p.TailDelayMs == 3000 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := mustResolve(t, tt.policy); !tt.check(got) {
				t.Errorf("Resolve(%v) = %+v", tt.policy, exported(got))
			}
		})
	}
}

// TestResolveDoesNotAliasInput checks that the resolved policy owns its
// codes and schedule: the caller may reuse its request message.
func TestResolveDoesNotAliasInput(t *testing.T) {
	t.Parallel()
	in := &retrydv1.RetryPolicy{Mode: schedule, RetryableCodes: []string{"SERVER", "AUTH"}, Schedule: []uint64{1000, 2000}}
	p := mustResolve(t, in)
	key := p.Key
	in.RetryableCodes[0], in.Schedule[0] = "TIMEOUT", 9999
	if !slices.Equal(p.Codes, []string{"AUTH", "SERVER"}) || !slices.Equal(p.Schedule, []uint64{1000, 2000}) {
		t.Errorf("policy changed with its input: codes %v schedule %v", p.Codes, p.Schedule)
	}
	if !p.Retryable("SERVER") || p.Retryable("TIMEOUT") {
		t.Error("code index changed with the input")
	}
	if p.Key != key {
		t.Errorf("key changed: %q", p.Key)
	}
}

func TestResolveScheduleDoesNotAliasDefault(t *testing.T) {
	t.Parallel()
	p := mustResolve(t, &retrydv1.RetryPolicy{Mode: schedule})
	if len(p.Schedule) > 0 && len(DefaultSchedule) > 0 && &p.Schedule[0] == &DefaultSchedule[0] {
		t.Error("resolved policy's Schedule shares its backing array with DefaultSchedule")
	}
}

func TestProtoDoesNotAliasPolicy(t *testing.T) {
	t.Parallel()
	for _, in := range []*retrydv1.RetryPolicy{
		{Mode: normal},
		{Mode: schedule, MaxRetries: u32(3)},
	} {
		p := mustResolve(t, in)
		before := exported(p)
		pr := p.Proto()
		*pr.MinAttemptMs = 1
		if pr.MaxRetries != nil {
			*pr.MaxRetries = 99
		}
		if pr.TailDelayMs != nil {
			*pr.TailDelayMs = 1
		}
		if b := pr.GetBackoff(); b != nil {
			*b.InitialDelayMs, *b.MaxDelayMs, *b.Multiplier, *b.JitterRatio = 1, 1, 1, 0
		}
		if after := exported(p); !reflect.DeepEqual(after, before) {
			t.Errorf("writing through Proto() changed the policy:\nbefore %+v\n after %+v", before, after)
		}
	}
}

func TestProtoRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		policy *retrydv1.RetryPolicy
		want   *retrydv1.RetryPolicy
	}{
		{"normal default", nil, &retrydv1.RetryPolicy{
			Mode:           normal,
			MaxRetries:     u32(2),
			RetryableCodes: []string{"EMPTY_RESPONSE", "RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT"},
			Backoff: &retrydv1.Backoff{
				InitialDelayMs: u64(500), MaxDelayMs: u64(10000), Multiplier: f64(2), JitterRatio: f64(0.1), Jitter: symmetric,
			},
			RetryAfterOverCap: overCapDelegate,
			MinAttemptMs:      u64(100),
		}},
		{"always default", &retrydv1.RetryPolicy{Mode: always}, &retrydv1.RetryPolicy{
			Mode: always,
			Backoff: &retrydv1.Backoff{
				InitialDelayMs: u64(500), MaxDelayMs: u64(10000), Multiplier: f64(2), JitterRatio: f64(0.1), Jitter: symmetric,
			},
			RetryAfterOverCap: overCapLocal,
			MinAttemptMs:      u64(100),
		}},
		{"schedule bounded custom", &retrydv1.RetryPolicy{
			Mode: schedule, MaxRetries: u32(4), RetryableCodes: []string{"SERVER", "HTTP_*"},
			Schedule: []uint64{1000, 3000}, TailDelayMs: u64(7000), MinAttemptMs: u64(0),
		}, &retrydv1.RetryPolicy{
			Mode: schedule, MaxRetries: u32(4), RetryableCodes: []string{"HTTP_*", "SERVER"},
			Schedule: []uint64{1000, 3000}, TailDelayMs: u64(7000),
			RetryAfterOverCap: overCapLocal, MinAttemptMs: u64(0),
		}},
		{"normal full jitter honor", &retrydv1.RetryPolicy{
			MaxRetries: u32(5), RetryableCodes: []string{"SERVER"},
			Backoff:           &retrydv1.Backoff{InitialDelayMs: u64(100), MaxDelayMs: u64(1000), Multiplier: f64(1.5), Jitter: full},
			RetryAfterOverCap: overCapHonor,
		}, &retrydv1.RetryPolicy{
			Mode: normal, MaxRetries: u32(5), RetryableCodes: []string{"SERVER"},
			Backoff: &retrydv1.Backoff{
				InitialDelayMs: u64(100), MaxDelayMs: u64(1000), Multiplier: f64(1.5), JitterRatio: f64(0.1), Jitter: full,
			},
			RetryAfterOverCap: overCapHonor,
			MinAttemptMs:      u64(100),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := mustResolve(t, tt.policy)
			got := p.Proto()
			if !proto.Equal(got, tt.want) {
				t.Errorf("Proto() =\n %v\nwant\n %v", got, tt.want)
			}
			again := mustResolve(t, got)
			if !reflect.DeepEqual(exported(again), exported(p)) {
				t.Errorf("Resolve(Proto()) = %+v, want %+v", exported(again), exported(p))
			}
		})
	}
}

// TestCanonicalKeyGolden reads harness-style policies (proto-JSON with the
// camelCase names of a retryPolicy block) and their expected keys from
// testdata/canonical_keys.json.
func TestCanonicalKeyGolden(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join("testdata", "canonical_keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Name   string          `json:"name"`
		Policy json.RawMessage `json:"policy"`
		Key    string          `json:"key"`
	}
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 10 {
		t.Fatalf("golden table has %d cases, want at least 10", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			var in retrydv1.RetryPolicy
			if err := protojson.Unmarshal(tc.Policy, &in); err != nil {
				t.Fatalf("policy %s: %v", tc.Policy, err)
			}
			if got := mustResolve(t, &in).Key; got != tc.Key {
				t.Errorf("key of %s\n got %s\nwant %s", tc.Policy, got, tc.Key)
			}
		})
	}
}

// TestCanonicalKeyEquivalence: policies within a group share one key;
// policies of different groups never do.
func TestCanonicalKeyEquivalence(t *testing.T) {
	t.Parallel()
	groups := []struct {
		name     string
		policies []*retrydv1.RetryPolicy
	}{
		{"normal default", []*retrydv1.RetryPolicy{
			nil,
			{},
			{Mode: normal},
			{MaxRetries: u32(2)},
			{RetryableCodes: []string{"TRANSPORT", "TIMEOUT", "SERVER", "RATE_LIMIT", "EMPTY_RESPONSE"}},
			{Backoff: &retrydv1.Backoff{}},
			{Backoff: &retrydv1.Backoff{InitialDelayMs: u64(500)}},
			{Backoff: &retrydv1.Backoff{MaxDelayMs: u64(10000)}},
			{Backoff: &retrydv1.Backoff{Multiplier: f64(2.0)}},
			{Backoff: &retrydv1.Backoff{JitterRatio: f64(0.1)}},
			{Backoff: &retrydv1.Backoff{Jitter: symmetric}},
			{RetryAfterOverCap: overCapDelegate},
			{MinAttemptMs: u64(100)},
		}},
		{"normal max 3", []*retrydv1.RetryPolicy{{MaxRetries: u32(3)}, {Mode: normal, MaxRetries: u32(3)}}},
		{"normal max 0", []*retrydv1.RetryPolicy{{MaxRetries: u32(0)}}},
		{"normal codes SERVER,TIMEOUT", []*retrydv1.RetryPolicy{
			{RetryableCodes: []string{"SERVER", "TIMEOUT"}},
			{RetryableCodes: []string{"TIMEOUT", "SERVER"}},
		}},
		{"normal codes SERVER,TIMEOUT,HTTP_*", []*retrydv1.RetryPolicy{
			{RetryableCodes: []string{"HTTP_*", "SERVER", "TIMEOUT"}},
			{RetryableCodes: []string{"TIMEOUT", "HTTP_*", "SERVER"}},
			{RetryableCodes: []string{"SERVER", "TIMEOUT", "HTTP_*"}},
		}},
		{"normal initial 1000", []*retrydv1.RetryPolicy{{Backoff: &retrydv1.Backoff{InitialDelayMs: u64(1000)}}}},
		{"normal max delay 20000", []*retrydv1.RetryPolicy{{Backoff: &retrydv1.Backoff{MaxDelayMs: u64(20000)}}}},
		{"normal multiplier 1.5", []*retrydv1.RetryPolicy{{Backoff: &retrydv1.Backoff{Multiplier: f64(1.5)}}}},
		{"normal jitter 0", []*retrydv1.RetryPolicy{{Backoff: &retrydv1.Backoff{JitterRatio: f64(0)}}}},
		{"normal jitter 0.2", []*retrydv1.RetryPolicy{{Backoff: &retrydv1.Backoff{JitterRatio: f64(0.2)}}}},
		{"normal full jitter (ratio ignored)", []*retrydv1.RetryPolicy{
			{Backoff: &retrydv1.Backoff{Jitter: full}},
			{Backoff: &retrydv1.Backoff{Jitter: full, JitterRatio: f64(0)}},
			{Backoff: &retrydv1.Backoff{Jitter: full, JitterRatio: f64(0.1)}},
			{Backoff: &retrydv1.Backoff{Jitter: full, JitterRatio: f64(0.7)}},
			{Backoff: &retrydv1.Backoff{Jitter: full, JitterRatio: f64(1)}},
		}},
		{"normal over-cap local", []*retrydv1.RetryPolicy{{RetryAfterOverCap: overCapLocal}}},
		{"normal over-cap honor", []*retrydv1.RetryPolicy{{RetryAfterOverCap: overCapHonor}}},
		{"normal min attempt 0", []*retrydv1.RetryPolicy{{MinAttemptMs: u64(0)}}},
		{"always default", []*retrydv1.RetryPolicy{
			{Mode: always},
			{Mode: always, Backoff: &retrydv1.Backoff{}},
			{Mode: always, RetryAfterOverCap: overCapLocal},
			{Mode: always, MinAttemptMs: u64(100)},
		}},
		{"always over-cap delegate", []*retrydv1.RetryPolicy{{Mode: always, RetryAfterOverCap: overCapDelegate}}},
		{"always README example", []*retrydv1.RetryPolicy{
			{Mode: always, Backoff: &retrydv1.Backoff{InitialDelayMs: u64(1000), MaxDelayMs: u64(30000), JitterRatio: f64(0.2)}},
		}},
		{"schedule default", []*retrydv1.RetryPolicy{
			{Mode: schedule},
			{Mode: schedule, Schedule: []uint64{2000, 5000, 5000, 5000, 10000}},
			{Mode: schedule, TailDelayMs: u64(20000)},
			{Mode: schedule, RetryableCodes: reversed(DefaultScheduleCodes)},
			{Mode: schedule, RetryAfterOverCap: overCapLocal},
		}},
		{"schedule max 5", []*retrydv1.RetryPolicy{{Mode: schedule, MaxRetries: u32(5)}}},
		{"schedule 1000,3000", []*retrydv1.RetryPolicy{{Mode: schedule, Schedule: []uint64{1000, 3000}}}},
		{"schedule 3000,1000", []*retrydv1.RetryPolicy{{Mode: schedule, Schedule: []uint64{3000, 1000}}}},
		{"schedule 10000,5000,5000,5000,2000", []*retrydv1.RetryPolicy{{Mode: schedule, Schedule: []uint64{10000, 5000, 5000, 5000, 2000}}}},
		{"schedule tail 30000", []*retrydv1.RetryPolicy{{Mode: schedule, TailDelayMs: u64(30000)}}},
		{"schedule codes SERVER,TIMEOUT", []*retrydv1.RetryPolicy{
			{Mode: schedule, RetryableCodes: []string{"TIMEOUT", "SERVER"}},
		}},
	}
	owner := map[string]string{}
	for _, g := range groups {
		var key string
		for i, in := range g.policies {
			got := mustResolve(t, in).Key
			if i == 0 {
				key = got
				continue
			}
			if got != key {
				t.Errorf("%s: policy %d (%v) has key\n %s\nwant the group's key\n %s", g.name, i, in, got, key)
			}
		}
		if other, ok := owner[key]; ok {
			t.Errorf("groups %q and %q share the key %s", other, g.name, key)
		}
		owner[key] = g.name
	}
}

func TestCanonicalKeyNegativeZeroJitter(t *testing.T) {
	t.Parallel()
	pos := mustResolve(t, &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{JitterRatio: f64(0)}})
	neg := mustResolve(t, &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{JitterRatio: f64(math.Copysign(0, -1))}})
	if pos.Key != neg.Key {
		t.Errorf("jitter_ratio 0 and -0 give different keys:\n %s\n %s", pos.Key, neg.Key)
	}
}

func TestResolveValidation(t *testing.T) {
	t.Parallel()
	codes65 := distinctCodes(MaxCodes + 1)
	schedule65 := slices.Repeat([]uint64{1000}, MaxScheduleLen+1)
	tests := []struct {
		name   string
		policy *retrydv1.RetryPolicy
		fields []string // every violation's field, in any order
	}{
		// mode and enums
		{"unknown mode 4", &retrydv1.RetryPolicy{Mode: 4}, []string{"mode"}},
		{"unknown mode -1", &retrydv1.RetryPolicy{Mode: -1}, []string{"mode"}},
		{"unknown jitter 3", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Jitter: 3}}, []string{"backoff.jitter"}},
		{"unknown jitter -1 in always", &retrydv1.RetryPolicy{Mode: always, Backoff: &retrydv1.Backoff{Jitter: -1}}, []string{"backoff.jitter"}},
		{"unknown over-cap 4", &retrydv1.RetryPolicy{RetryAfterOverCap: 4}, []string{"retry_after_over_cap"}},
		{"unknown over-cap in schedule", &retrydv1.RetryPolicy{Mode: schedule, RetryAfterOverCap: 100}, []string{"retry_after_over_cap"}},

		// backoff bounds
		{"initial 0", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: u64(0)}}, []string{"backoff.initial_delay_ms"}},
		{"initial 0 in always", &retrydv1.RetryPolicy{Mode: always, Backoff: &retrydv1.Backoff{InitialDelayMs: u64(0)}}, []string{"backoff.initial_delay_ms"}},
		{"initial over 2147483647", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: u64(maxInt32 + 1), MaxDelayMs: u64(maxInt32)}},
			[]string{"backoff.initial_delay_ms", "backoff.max_delay_ms"}},
		{"initial max uint64", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: u64(math.MaxUint64), MaxDelayMs: u64(math.MaxUint64)}},
			[]string{"backoff.initial_delay_ms", "backoff.max_delay_ms"}},
		{"initial over default max", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: u64(10001)}}, []string{"backoff.max_delay_ms"}},
		{"max below initial", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: u64(1000), MaxDelayMs: u64(999)}}, []string{"backoff.max_delay_ms"}},
		{"max below default initial", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{MaxDelayMs: u64(499)}}, []string{"backoff.max_delay_ms"}},
		{"max 0", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{MaxDelayMs: u64(0)}}, []string{"backoff.max_delay_ms"}},
		{"max over 2147483647", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{MaxDelayMs: u64(maxInt32 + 1)}}, []string{"backoff.max_delay_ms"}},
		{"multiplier 0.999", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Multiplier: f64(0.999)}}, []string{"backoff.multiplier"}},
		{"multiplier 0", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Multiplier: f64(0)}}, []string{"backoff.multiplier"}},
		{"multiplier -2", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Multiplier: f64(-2)}}, []string{"backoff.multiplier"}},
		{"multiplier NaN", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Multiplier: f64(math.NaN())}}, []string{"backoff.multiplier"}},
		{"multiplier +Inf", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Multiplier: f64(math.Inf(1))}}, []string{"backoff.multiplier"}},
		{"multiplier -Inf", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Multiplier: f64(math.Inf(-1))}}, []string{"backoff.multiplier"}},
		{"jitter ratio -0.01", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{JitterRatio: f64(-0.01)}}, []string{"backoff.jitter_ratio"}},
		{"jitter ratio 1.01", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{JitterRatio: f64(1.01)}}, []string{"backoff.jitter_ratio"}},
		{"jitter ratio NaN", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{JitterRatio: f64(math.NaN())}}, []string{"backoff.jitter_ratio"}},
		{"jitter ratio +Inf", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{JitterRatio: f64(math.Inf(1))}}, []string{"backoff.jitter_ratio"}},
		{"jitter ratio 2 with full jitter", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{JitterRatio: f64(2), Jitter: full}}, []string{"backoff.jitter_ratio"}},

		// schedule mode
		{"schedule entry 0", &retrydv1.RetryPolicy{Mode: schedule, Schedule: []uint64{0}}, []string{"schedule[0]"}},
		{"schedule entries 1 and 2", &retrydv1.RetryPolicy{Mode: schedule, Schedule: []uint64{2000, 0, maxInt32 + 1}},
			[]string{"schedule[1]", "schedule[2]"}},
		{"schedule entry over 2147483647", &retrydv1.RetryPolicy{Mode: schedule, Schedule: []uint64{1000, 2000, 3000, math.MaxUint64}},
			[]string{"schedule[3]"}},
		{"schedule longer than 64", &retrydv1.RetryPolicy{Mode: schedule, Schedule: schedule65}, []string{"schedule"}},
		{"tail 0", &retrydv1.RetryPolicy{Mode: schedule, TailDelayMs: u64(0)}, []string{"tail_delay_ms"}},
		{"tail over 2147483647", &retrydv1.RetryPolicy{Mode: schedule, TailDelayMs: u64(maxInt32 + 1)}, []string{"tail_delay_ms"}},
		{"backoff in schedule mode", &retrydv1.RetryPolicy{Mode: schedule, Backoff: &retrydv1.Backoff{InitialDelayMs: u64(500)}}, []string{"backoff"}},
		{"empty backoff in schedule mode", &retrydv1.RetryPolicy{Mode: schedule, Backoff: &retrydv1.Backoff{}}, []string{"backoff"}},

		// codes
		{"bare star", &retrydv1.RetryPolicy{RetryableCodes: []string{"*"}}, []string{"retryable_codes[0]"}},
		{"bare star second", &retrydv1.RetryPolicy{Mode: schedule, RetryableCodes: []string{"SERVER", "*"}}, []string{"retryable_codes[1]"}},
		{"double star", &retrydv1.RetryPolicy{RetryableCodes: []string{"HTTP_**"}}, []string{"retryable_codes[0]"}},
		{"star in the middle", &retrydv1.RetryPolicy{RetryableCodes: []string{"HTTP_*_X"}}, []string{"retryable_codes[0]"}},
		{"duplicate code", &retrydv1.RetryPolicy{RetryableCodes: []string{"SERVER", "TIMEOUT", "SERVER"}}, []string{"retryable_codes[2]"}},
		{"duplicate prefix rule", &retrydv1.RetryPolicy{Mode: schedule, RetryableCodes: []string{"HTTP_*", "HTTP_*"}}, []string{"retryable_codes[1]"}},
		{"lowercase code", &retrydv1.RetryPolicy{RetryableCodes: []string{"SERVER", "rate_limit"}}, []string{"retryable_codes[1]"}},
		{"mixed case code", &retrydv1.RetryPolicy{RetryableCodes: []string{"Server"}}, []string{"retryable_codes[0]"}},
		{"lowercase prefix rule", &retrydv1.RetryPolicy{RetryableCodes: []string{"http_*"}}, []string{"retryable_codes[0]"}},
		{"code with a space", &retrydv1.RetryPolicy{RetryableCodes: []string{"RATE LIMIT"}}, []string{"retryable_codes[0]"}},
		{"code with a trailing space", &retrydv1.RetryPolicy{RetryableCodes: []string{"SERVER", "TIMEOUT "}}, []string{"retryable_codes[1]"}},
		{"code with a hyphen", &retrydv1.RetryPolicy{RetryableCodes: []string{"RATE-LIMIT"}}, []string{"retryable_codes[0]"}},
		{"code starting with a digit", &retrydv1.RetryPolicy{RetryableCodes: []string{"5XX"}}, []string{"retryable_codes[0]"}},
		{"code starting with underscore", &retrydv1.RetryPolicy{RetryableCodes: []string{"_SERVER"}}, []string{"retryable_codes[0]"}},
		{"empty code", &retrydv1.RetryPolicy{RetryableCodes: []string{""}}, []string{"retryable_codes[0]"}},
		{"code of 65 bytes", &retrydv1.RetryPolicy{RetryableCodes: []string{strings.Repeat("A", MaxCodeLen+1)}}, []string{"retryable_codes[0]"}},
		{"ABORTED", &retrydv1.RetryPolicy{RetryableCodes: []string{"SERVER", "ABORTED"}}, []string{"retryable_codes[1]"}},
		{"ABORTED in schedule", &retrydv1.RetryPolicy{Mode: schedule, RetryableCodes: []string{"ABORTED"}}, []string{"retryable_codes[0]"}},
		{"65 codes", &retrydv1.RetryPolicy{RetryableCodes: codes65}, []string{"retryable_codes"}},
		{"several bad codes", &retrydv1.RetryPolicy{RetryableCodes: []string{"*", "SERVER", "server", "SERVER", "ABORTED"}},
			[]string{"retryable_codes[0]", "retryable_codes[2]", "retryable_codes[3]", "retryable_codes[4]"}},

		// fields of another mode
		{"max_retries in always", &retrydv1.RetryPolicy{Mode: always, MaxRetries: u32(3)}, []string{"max_retries"}},
		{"max_retries 0 in always", &retrydv1.RetryPolicy{Mode: always, MaxRetries: u32(0)}, []string{"max_retries"}},
		{"codes in always", &retrydv1.RetryPolicy{Mode: always, RetryableCodes: []string{"SERVER"}}, []string{"retryable_codes"}},
		{"schedule in normal", &retrydv1.RetryPolicy{Schedule: []uint64{1000}}, []string{"schedule"}},
		{"tail in normal", &retrydv1.RetryPolicy{TailDelayMs: u64(20000)}, []string{"tail_delay_ms"}},
		{"schedule in always", &retrydv1.RetryPolicy{Mode: always, Schedule: []uint64{1000}}, []string{"schedule"}},
		{"tail in always", &retrydv1.RetryPolicy{Mode: always, TailDelayMs: u64(20000)}, []string{"tail_delay_ms"}},

		// common
		{"min_attempt over 2147483647", &retrydv1.RetryPolicy{MinAttemptMs: u64(maxInt32 + 1)}, []string{"min_attempt_ms"}},
		{"min_attempt over 2147483647 in schedule", &retrydv1.RetryPolicy{Mode: schedule, MinAttemptMs: u64(math.MaxUint64)}, []string{"min_attempt_ms"}},

		// every violation is listed, not only the first
		{"many at once", &retrydv1.RetryPolicy{
			Mode:              always,
			MaxRetries:        u32(1),
			RetryableCodes:    []string{"SERVER"},
			Backoff:           &retrydv1.Backoff{InitialDelayMs: u64(0), Multiplier: f64(0.5), JitterRatio: f64(-1), Jitter: 9},
			Schedule:          []uint64{1},
			TailDelayMs:       u64(1),
			RetryAfterOverCap: 9,
			MinAttemptMs:      u64(maxInt32 + 1),
		}, []string{
			"backoff.initial_delay_ms", "backoff.jitter", "backoff.jitter_ratio", "backoff.multiplier",
			"max_retries", "min_attempt_ms", "retry_after_over_cap", "retryable_codes", "schedule", "tail_delay_ms",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Resolve(tt.policy)
			if err == nil {
				t.Fatalf("Resolve(%v) = %q, want a validation error", tt.policy, p.Key)
			}
			if p != nil {
				t.Errorf("Resolve returned a policy with its error: %+v", exported(p))
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v is %T, want *ValidationError", err, err)
			}
			var got []string
			for _, v := range ve.Violations {
				got = append(got, v.Field)
				if v.Description == "" {
					t.Errorf("violation of %s has no description", v.Field)
				}
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tt.fields))
			if !slices.Equal(got, want) {
				t.Errorf("violations name %q, want %q (%v)", got, want, err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "policy: invalid: ") {
				t.Errorf("Error() = %q, want prefix %q", msg, "policy: invalid: ")
			}
			for _, f := range tt.fields {
				if !strings.Contains(msg, f+": ") {
					t.Errorf("Error() = %q does not name %s", msg, f)
				}
			}
		})
	}
}

// TestResolveValidBounds: the inclusive ends of every range are accepted.
func TestResolveValidBounds(t *testing.T) {
	t.Parallel()
	codes64 := distinctCodes(MaxCodes)
	tests := []struct {
		name   string
		policy *retrydv1.RetryPolicy
	}{
		{"initial 1", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: u64(1), MaxDelayMs: u64(1)}}},
		{"initial = max = 2147483647", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{InitialDelayMs: u64(maxInt32), MaxDelayMs: u64(maxInt32)}}},
		{"max 2147483647", &retrydv1.RetryPolicy{Mode: always, Backoff: &retrydv1.Backoff{MaxDelayMs: u64(maxInt32)}}},
		{"multiplier 1", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Multiplier: f64(1)}}},
		{"multiplier 1e300", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{Multiplier: f64(1e300)}}},
		{"jitter ratio 0", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{JitterRatio: f64(0)}}},
		{"jitter ratio 1", &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{JitterRatio: f64(1)}}},
		{"max_retries 0", &retrydv1.RetryPolicy{MaxRetries: u32(0)}},
		{"max_retries max uint32", &retrydv1.RetryPolicy{Mode: schedule, MaxRetries: u32(math.MaxUint32)}},
		{"64 codes", &retrydv1.RetryPolicy{RetryableCodes: codes64}},
		{"code of 64 bytes", &retrydv1.RetryPolicy{RetryableCodes: []string{strings.Repeat("A", MaxCodeLen)}}},
		{"single-letter code", &retrydv1.RetryPolicy{RetryableCodes: []string{"A"}}},
		{"single-letter prefix rule", &retrydv1.RetryPolicy{RetryableCodes: []string{"A*"}}},
		{"code with digits and underscores", &retrydv1.RetryPolicy{RetryableCodes: []string{"HTTP_404", "A_1_B_2"}}},
		{"code and prefix rule of the same stem", &retrydv1.RetryPolicy{RetryableCodes: []string{"HTTP_404", "HTTP_*", "HTTP"}}},
		{"schedule of 64 entries", &retrydv1.RetryPolicy{Mode: schedule, Schedule: slices.Repeat([]uint64{1}, MaxScheduleLen)}},
		{"schedule entry 1 and 2147483647", &retrydv1.RetryPolicy{Mode: schedule, Schedule: []uint64{1, maxInt32}}},
		{"tail 1", &retrydv1.RetryPolicy{Mode: schedule, TailDelayMs: u64(1)}},
		{"tail 2147483647", &retrydv1.RetryPolicy{Mode: schedule, TailDelayMs: u64(maxInt32)}},
		{"min_attempt 0", &retrydv1.RetryPolicy{MinAttemptMs: u64(0)}},
		{"min_attempt 2147483647", &retrydv1.RetryPolicy{MinAttemptMs: u64(maxInt32)}},
		{"empty codes list means default", &retrydv1.RetryPolicy{Mode: always, RetryableCodes: []string{}}},
		{"empty schedule in normal", &retrydv1.RetryPolicy{Schedule: []uint64{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := Resolve(tt.policy); err != nil {
				t.Errorf("Resolve(%v): %v", tt.policy, err)
			}
		})
	}
}

func TestValidateCode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code string
		ok   bool
	}{
		{"RATE_LIMIT", true},
		{"HTTP_404", true},
		{"A", true},
		{"A_", true},
		{strings.Repeat("Z", 64), true},
		{"", false},
		{strings.Repeat("Z", 65), false},
		{"rate_limit", false},
		{"1ABC", false},
		{"_ABC", false},
		{"AB C", false},
		{"AB-C", false},
		{"HTTP_*", false}, // a prefix rule is not a code; Resolve strips the * first
		{"ÄBC", false},
		{"AB\x00", false},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			t.Parallel()
			msg := ValidateCode(tt.code)
			if (msg == "") != tt.ok {
				t.Errorf("ValidateCode(%q) = %q, want ok=%v", tt.code, msg, tt.ok)
			}
		})
	}
}

func TestRetryable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		policy *retrydv1.RetryPolicy
		code   string
		want   bool
	}{
		{"normal RATE_LIMIT", nil, "RATE_LIMIT", true},
		{"normal EMPTY_RESPONSE", nil, "EMPTY_RESPONSE", true},
		{"normal TRANSPORT", nil, "TRANSPORT", true},
		{"normal AUTH", nil, "AUTH", false},
		{"normal HTTP_404", nil, "HTTP_404", false},
		{"normal empty code", nil, "", false},
		{"normal ABORTED", nil, "ABORTED", false},
		{"normal lowercase", nil, "rate_limit", false},
		{"normal prefix of a code", nil, "RATE", false},
		{"normal code extending a code", nil, "SERVER_X", false},
		{"schedule AUTH", &retrydv1.RetryPolicy{Mode: schedule}, "AUTH", true},
		{"schedule MALFORMED_RESPONSE", &retrydv1.RetryPolicy{Mode: schedule}, "MALFORMED_RESPONSE", true},
		{"schedule HTTP_404", &retrydv1.RetryPolicy{Mode: schedule}, "HTTP_404", true},
		{"schedule HTTP_422", &retrydv1.RetryPolicy{Mode: schedule}, "HTTP_422", true},
		{"schedule HTTPX", &retrydv1.RetryPolicy{Mode: schedule}, "HTTPX", false},
		{"schedule HTTP", &retrydv1.RetryPolicy{Mode: schedule}, "HTTP", false},
		{"schedule CONTEXT_WINDOW_EXCEEDED", &retrydv1.RetryPolicy{Mode: schedule}, "CONTEXT_WINDOW_EXCEEDED", false},
		{"schedule INVALID_REQUEST", &retrydv1.RetryPolicy{Mode: schedule}, "INVALID_REQUEST", false},
		{"schedule MISSING_CREDENTIAL", &retrydv1.RetryPolicy{Mode: schedule}, "MISSING_CREDENTIAL", false},
		{"schedule UNKNOWN", &retrydv1.RetryPolicy{Mode: schedule}, "UNKNOWN", false},
		{"schedule ABORTED", &retrydv1.RetryPolicy{Mode: schedule}, "ABORTED", false},
		{"always UNKNOWN", &retrydv1.RetryPolicy{Mode: always}, "UNKNOWN", true},
		{"always AUTH", &retrydv1.RetryPolicy{Mode: always}, "AUTH", true},
		{"always ABORTED", &retrydv1.RetryPolicy{Mode: always}, "ABORTED", false},
		{"prefix AB* never matches ABORTED", &retrydv1.RetryPolicy{RetryableCodes: []string{"AB*"}}, "ABORTED", false},
		{"prefix AB* matches ABC", &retrydv1.RetryPolicy{RetryableCodes: []string{"AB*"}}, "ABC", true},
		{"custom codes replace the defaults", &retrydv1.RetryPolicy{RetryableCodes: []string{"AUTH"}}, "RATE_LIMIT", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := mustResolve(t, tt.policy).Retryable(tt.code); got != tt.want {
				t.Errorf("Retryable(%q) = %v, want %v", tt.code, got, tt.want)
			}
		})
	}
}

func TestDelayCapMs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		policy *retrydv1.RetryPolicy
		want   uint64
	}{
		{"normal default", nil, 10000},
		{"always README example", &retrydv1.RetryPolicy{Mode: always, Backoff: &retrydv1.Backoff{MaxDelayMs: u64(30000)}}, 30000},
		{"schedule default is the tail", &retrydv1.RetryPolicy{Mode: schedule}, 20000},
		{"schedule entry above the tail", &retrydv1.RetryPolicy{Mode: schedule, Schedule: []uint64{1000, 30000}, TailDelayMs: u64(5000)}, 30000},
		{"schedule tail above the entries", &retrydv1.RetryPolicy{Mode: schedule, Schedule: []uint64{1000}, TailDelayMs: u64(1001)}, 1001},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := mustResolve(t, tt.policy).DelayCapMs(); got != tt.want {
				t.Errorf("DelayCapMs() = %d, want %d", got, tt.want)
			}
		})
	}
}
