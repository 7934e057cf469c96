package auth_test

import (
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/retryd/retryd/auth"
)

// FuzzLoadCredentials: Parse never panics and never accepts a file that
// breaks its rules. A refusal is an error with text and no credentials;
// an accepted file has at least one tenant, each with a unique id that
// passes the session-id rules, counts that add up, allow-lists without
// duplicates, and the same result when parsed again. Its seeds are
// committed under testdata/fuzz/FuzzLoadCredentials (valid files, each
// kind of refusal, YAML oddities: anchors, aliases, tags, documents,
// deep nesting); crashers found by `go test -fuzz` are kept there too.
func FuzzLoadCredentials(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := auth.Parse(data)
		if err != nil {
			if c != nil {
				t.Fatalf("Parse returned credentials with its error %v", err)
			}
			if err.Error() == "" {
				t.Fatal("Parse failed with an empty error")
			}
			return
		}
		sums := c.Summaries()
		tenants, tokens, certs := c.Len()
		if tenants == 0 || tenants != len(sums) {
			t.Fatalf("accepted %d tenants, %d summaries", tenants, len(sums))
		}
		ids := map[string]bool{}
		var sumTokens, sumCerts int
		for _, s := range sums {
			if s.ID == "" || len(s.ID) > auth.MaxTenantIDLen || !utf8.ValidString(s.ID) ||
				strings.IndexFunc(s.ID, unicode.IsControl) >= 0 {
				t.Fatalf("accepted tenant id %q", s.ID)
			}
			if ids[s.ID] {
				t.Fatalf("accepted tenant id %q twice", s.ID)
			}
			ids[s.ID] = true
			for _, l := range [][]string{s.Providers, s.Policies} {
				sorted := slices.Clone(l)
				slices.Sort(sorted)
				if len(slices.Compact(sorted)) != len(l) || slices.Contains(l, "") {
					t.Fatalf("tenant %q: allow-list %q has duplicates or an empty name", s.ID, l)
				}
			}
			sumTokens += s.Tokens
			sumCerts += s.ClientCertificates
		}
		if sumTokens != tokens || sumCerts != certs {
			t.Fatalf("Len says %d tokens, %d certificates; summaries %d, %d", tokens, certs, sumTokens, sumCerts)
		}
		again, err := auth.Parse(data)
		if err != nil {
			t.Fatalf("second Parse of accepted bytes failed: %v", err)
		}
		if !slices.EqualFunc(sums, again.Summaries(), func(a, b auth.Summary) bool {
			return a.ID == b.ID && a.Tokens == b.Tokens && a.ClientCertificates == b.ClientCertificates &&
				slices.Equal(a.Providers, b.Providers) && slices.Equal(a.Policies, b.Policies)
		}) {
			t.Fatal("two parses of the same bytes differ")
		}
		// No token of the file is guessable from its own content: the
		// hash itself is not a token.
		if c.TenantForToken(string(data)) != nil || c.TenantForToken("") != nil {
			t.Fatal("the file's bytes or the empty token authenticate")
		}
	})
}
