package auth_test

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/retryd/retryd/auth"
)

// Tokens of the tests and their hashes, as an operator would produce them.
const (
	tokenA = "token-a-0123456789abcdef0123456789abcdef"
	tokenB = "token-b-0123456789abcdef0123456789abcdef"
	tokenC = "token-c-0123456789abcdef0123456789abcdef"
)

var (
	hashA = auth.HashToken(tokenA)
	hashB = auth.HashToken(tokenB)
	hashC = auth.HashToken(tokenC)
)

// exampleFile is the file of docs/security.md.
var exampleFile = `
tenants:
  - id: team-a
    tokens:
      - sha256: "` + hashA + `"
      - sha256: "` + strings.ToUpper(hashC) + `"
    providers: [openai, deepseek]
    policies: [interactive]
    clientCertificates:
      - uriSAN: "spiffe://example.org/team-a"
      - dnsSAN: "Agents.Team-A.internal"
      - commonName: "team-a-agents"
  - id: team-b
    tokens:
      - sha256: "` + hashB + `"
    providers: []
`

func TestHashToken(t *testing.T) {
	t.Parallel()
	// printf %s test | sha256sum
	if got := auth.HashToken("test"); got != "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" {
		t.Errorf("HashToken(test) = %s", got)
	}
}

// TestParseExample: docs/security.md's file loads; tokens (hashes in either
// case) and certificate identities map to their tenants with their
// allow-lists; absent lists mean any, [] means none.
func TestParseExample(t *testing.T) {
	t.Parallel()
	c, err := auth.Parse([]byte(exampleFile))
	if err != nil {
		t.Fatal(err)
	}
	if tenants, tokens, certs := c.Len(); tenants != 2 || tokens != 3 || certs != 3 {
		t.Errorf("Len = %d, %d, %d; want 2, 3, 3", tenants, tokens, certs)
	}
	a := c.TenantForToken(tokenA)
	if a == nil || a.ID != "team-a" || !slices.Equal(a.Providers, []string{"openai", "deepseek"}) ||
		!slices.Equal(a.Policies, []string{"interactive"}) {
		t.Fatalf("token A: %+v", a)
	}
	if c.TenantForToken(tokenC) != a {
		t.Error("token C (hash written in upper case) does not map to team-a")
	}
	b := c.TenantForToken(tokenB)
	if b == nil || b.ID != "team-b" || b.Providers == nil || len(b.Providers) != 0 || b.Policies != nil {
		t.Fatalf("token B: %+v, want team-b with no provider and any policy", b)
	}
	if b.AllowsProvider("openai") || !b.AllowsPolicy("anything") {
		t.Error("team-b's allow-lists: providers [] must allow none, absent policies any")
	}
	for _, bad := range []string{"", "test", hashA, tokenA + " ", strings.ToUpper(tokenA)} {
		if got := c.TenantForToken(bad); got != nil {
			t.Errorf("TenantForToken(%q) = %s, want none", bad, got.ID)
		}
	}
	want := []auth.Summary{
		{ID: "team-a", Tokens: 2, ClientCertificates: 3, Providers: []string{"openai", "deepseek"}, Policies: []string{"interactive"}},
		{ID: "team-b", Tokens: 1, Providers: []string{}},
	}
	got := c.Summaries()
	if len(got) != len(want) {
		t.Fatalf("Summaries = %+v", got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.ID != w.ID || g.Tokens != w.Tokens || g.ClientCertificates != w.ClientCertificates ||
			!slices.Equal(g.Providers, w.Providers) || (g.Providers == nil) != (w.Providers == nil) ||
			!slices.Equal(g.Policies, w.Policies) || (g.Policies == nil) != (w.Policies == nil) {
			t.Errorf("Summaries[%d] = %+v, want %+v", i, g, w)
		}
	}
}

func cert(cn string, dns []string, uris ...string) *x509.Certificate {
	c := &x509.Certificate{Subject: pkix.Name{CommonName: cn}, DNSNames: dns}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			panic(err)
		}
		c.URIs = append(c.URIs, u)
	}
	return c
}

// TestTenantForCertificate: URI SANs decide first, then DNS SANs (any
// case), then the common name; identities of one kind naming two tenants
// are refused.
func TestTenantForCertificate(t *testing.T) {
	t.Parallel()
	c, err := auth.Parse([]byte(`
tenants:
  - id: a
    clientCertificates:
      - uriSAN: spiffe://example.org/a
      - dnsSAN: a.internal
      - commonName: cn-a
  - id: b
    clientCertificates:
      - uriSAN: spiffe://example.org/b
      - dnsSAN: b.internal
      - commonName: cn-b
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		cert        *x509.Certificate
		want, match string
		ambiguous   bool
	}{
		{"uri", cert("", nil, "spiffe://example.org/a"), "a", "uriSAN spiffe://example.org/a", false},
		{"dns", cert("", []string{"B.Internal"}), "b", "dnsSAN b.internal", false},
		{"cn", cert("cn-a", nil), "a", "commonName cn-a", false},
		{"uri beats dns and cn", cert("cn-a", []string{"a.internal"}, "spiffe://example.org/b"), "b", "uriSAN spiffe://example.org/b", false},
		{"dns beats cn", cert("cn-a", []string{"b.internal"}), "b", "dnsSAN b.internal", false},
		{"unmapped uri falls through to dns", cert("", []string{"a.internal"}, "spiffe://example.org/z"), "a", "dnsSAN a.internal", false},
		{"two tenants by uri", cert("", nil, "spiffe://example.org/a", "spiffe://example.org/b"), "", "", true},
		{"two tenants by dns", cert("", []string{"a.internal", "b.internal"}), "", "", true},
		{"ambiguity at a lower kind does not matter", cert("", []string{"a.internal", "b.internal"}, "spiffe://example.org/a"), "a", "uriSAN spiffe://example.org/a", false},
		{"cn compared exactly", cert("CN-A", nil), "", "", false},
		{"uri compared exactly", cert("", nil, "spiffe://example.org/a/"), "", "", false},
		{"nothing", cert("", nil), "", "", false},
	} {
		got, match, err := c.TenantForCertificate(tc.cert)
		switch {
		case tc.ambiguous:
			if !errors.Is(err, auth.ErrAmbiguousCertificate) || got != nil {
				t.Errorf("%s: %v %v, want ErrAmbiguousCertificate", tc.name, got, err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want == "" && got != nil:
			t.Errorf("%s: tenant %s, want none", tc.name, got.ID)
		case tc.want != "" && (got == nil || got.ID != tc.want || match != tc.match):
			t.Errorf("%s: %v by %q, want %s by %q", tc.name, got, match, tc.want, tc.match)
		}
	}
	if got, _, err := c.TenantForCertificate(nil); got != nil || err != nil {
		t.Errorf("nil certificate: %v %v", got, err)
	}
}

// TestParseErrors: every refusal names the path of the bad value (and
// all of them at once), and never quotes a token-like value.
func TestParseErrors(t *testing.T) {
	t.Parallel()
	tok := func(h string) string { return "\n    tokens: [{sha256: \"" + h + "\"}]" }
	for _, tc := range []struct {
		name string
		file string
		want []string // substrings of the error, in order
	}{
		{"empty file", "", []string{"tenants: required"}},
		{"only a comment", "# nothing\n", []string{"tenants: required"}},
		{"not YAML", "tenants: [\n", []string{"not valid YAML"}},
		{"a list at the top", "- id: a\n", []string{"(top level): must be a mapping with a tenants list, got a list"}},
		{"unknown top-level key", "tenants: [{id: a}]\ntenant: []\n", []string{"tenant: unknown field"}},
		{"tenants null", "tenants:\n", []string{"tenants: required"}},
		{"tenants not a list", "tenants: {id: a}\n", []string{"tenants: must be a list, got a mapping"}},
		{"no tenants", "tenants: []\n", []string{"tenants: must list at least one tenant"}},
		{"duplicate top-level key", "tenants: [{id: a}]\ntenants: [{id: b}]\n", []string{"not valid YAML", `"tenants" already set`}},
		{"duplicate key in a tenant", "tenants:\n  - id: a\n    id: b\n", []string{`"id" already set`}},
		{"second document", "tenants: [{id: a}]\n---\ntenants: [{id: b}]\n", []string{"more than one YAML document"}},
		{"broken second document", "tenants: [{id: a}]\n---\n: : [\n", []string{"more than one YAML document"}},
		{"tenant not a mapping", "tenants: [a]\n", []string{"tenants[0]: must be a mapping, got a string"}},
		{"unknown tenant key", "tenants:\n  - id: a\n    provider: [x]\n", []string{"tenants[0].provider: unknown field (want id, tokens, providers, policies, clientCertificates)"}},
		{"key in another case", "tenants:\n  - ID: a\n", []string{"tenants[0].ID: unknown field", "tenants[0].id: required"}},
		{"odd key is quoted", "tenants:\n  - id: a\n    \"x\\ty\": 1\n", []string{`tenants[0]."x\ty": unknown field`}},
		{"missing id", "tenants: [{tokens: []}]\n", []string{"tenants[0].id: required"}},
		{"empty id", "tenants: [{id: \"\"}]\n", []string{"tenants[0].id: must not be empty"}},
		{"numeric id", "tenants: [{id: 42}]\n", []string{"tenants[0].id: must be a string, got a number (quote it)"}},
		{"id with a control character", "tenants: [{id: \"a\\tb\"}]\n", []string{"tenants[0].id: must not contain control characters"}},
		{"not UTF-8", "tenants: [{id: a\xffb}]\n", []string{"not valid YAML"}},
		{"id too long", "tenants: [{id: " + strings.Repeat("x", 257) + "}]\n", []string{"tenants[0].id: must be at most 256 bytes, got 257"}},
		{"duplicate tenant id", "tenants: [{id: a}, {id: b}, {id: a}]\n", []string{`tenants[2].id: tenant "a" is already defined at tenants[0]`}},
		{"tokens not a list", "tenants:\n  - id: a\n    tokens: {sha256: x}\n", []string{"tenants[0].tokens: must be a list, got a mapping"}},
		{"token not a mapping", "tenants:\n  - id: a\n    tokens: [" + hashA + "]\n", []string{"tenants[0].tokens[0]: must be a mapping, got a string"}},
		{"token without sha256", "tenants:\n  - id: a\n    tokens: [{}]\n", []string{"tenants[0].tokens[0].sha256: required"}},
		{"token with another key", "tenants:\n  - id: a\n    tokens: [{sha256: \"" + hashA + "\", token: secret}]\n", []string{"tenants[0].tokens[0].token: unknown field (want sha256)"}},
		{"hash too short", "tenants:\n  - id: a" + tok(hashA[:63]), []string{"tenants[0].tokens[0].sha256: must be 64 hex digits (a SHA-256), got 63 characters"}},
		{"the token itself", "tenants:\n  - id: a" + tok(tokenA), []string{"tenants[0].tokens[0].sha256: must be 64 hex digits", "never the token"}},
		{"hash not hex", "tenants:\n  - id: a" + tok("g"+hashA[1:]), []string{"tenants[0].tokens[0].sha256: must be 64 hex digits (a SHA-256): not hexadecimal"}},
		{"hash of the empty string", "tenants:\n  - id: a" + tok(auth.HashToken("")), []string{"tenants[0].tokens[0].sha256: is the SHA-256 of the empty string"}},
		{"hash as a number", "tenants:\n  - id: a\n    tokens: [{sha256: 1234}]\n", []string{"tenants[0].tokens[0].sha256: must be a string, got a number"}},
		{"hash twice in one tenant", "tenants:\n  - id: a\n    tokens: [{sha256: \"" + hashA + "\"}, {sha256: \"" + strings.ToUpper(hashA) + "\"}]\n",
			[]string{"tenants[0].tokens[1].sha256: the same token hash is already listed at tenants[0].tokens[0].sha256"}},
		{"hash in two tenants", "tenants:\n  - id: a" + tok(hashA) + "\n  - id: b\n  - id: c" + tok(hashA),
			[]string{"tenants[2].tokens[0].sha256: the same token hash is already listed at tenants[0].tokens[0].sha256"}},
		{"providers null", "tenants:\n  - id: a\n    providers:\n", []string{"tenants[0].providers: is null"}},
		{"providers a string", "tenants:\n  - id: a\n    providers: openai\n", []string{"tenants[0].providers: must be a list, got a string"}},
		{"empty provider", "tenants:\n  - id: a\n    providers: [openai, \"\"]\n", []string{"tenants[0].providers[1]: must not be empty"}},
		{"duplicate provider", "tenants:\n  - id: a\n    providers: [openai, openai]\n", []string{`tenants[0].providers[1]: "openai" is listed twice`}},
		{"policy not a string", "tenants:\n  - id: a\n    policies: [[x]]\n", []string{"tenants[0].policies[0]: must be a string, got a list"}},
		{"policies null", "tenants:\n  - id: a\n    policies: ~\n", []string{"tenants[0].policies: is null"}},
		{"certificate with no identity", "tenants:\n  - id: a\n    clientCertificates: [{}]\n", []string{"tenants[0].clientCertificates[0]: must have exactly one of uriSAN, dnsSAN or commonName, got 0"}},
		{"certificate with two identities", "tenants:\n  - id: a\n    clientCertificates: [{uriSAN: \"spiffe://x/a\", commonName: a}]\n", []string{"tenants[0].clientCertificates[0]: must have exactly one of uriSAN, dnsSAN or commonName, got 2"}},
		{"certificate with an unknown kind", "tenants:\n  - id: a\n    clientCertificates: [{emailSAN: a@example.org}]\n", []string{"tenants[0].clientCertificates[0].emailSAN: unknown field"}},
		{"relative uri", "tenants:\n  - id: a\n    clientCertificates: [{uriSAN: team-a}]\n", []string{"tenants[0].clientCertificates[0].uriSAN: must be an absolute URI"}},
		{"bad dns name", "tenants:\n  - id: a\n    clientCertificates: [{dnsSAN: \"a b.internal\"}]\n", []string{"tenants[0].clientCertificates[0].dnsSAN: must be a DNS name"}},
		{"empty common name", "tenants:\n  - id: a\n    clientCertificates: [{commonName: \"\"}]\n", []string{"tenants[0].clientCertificates[0].commonName: must not be empty"}},
		{"dns name in two tenants, another case", "tenants:\n  - id: a\n    clientCertificates: [{dnsSAN: x.internal}]\n  - id: b\n    clientCertificates: [{dnsSAN: X.Internal}]\n",
			[]string{`tenants[1].clientCertificates[0].dnsSAN: dnsSAN "x.internal" is already listed at tenants[0].clientCertificates[0].dnsSAN`}},
		{"uri twice in one tenant", "tenants:\n  - id: a\n    clientCertificates: [{uriSAN: \"spiffe://x/a\"}, {uriSAN: \"spiffe://x/a\"}]\n",
			[]string{"tenants[0].clientCertificates[1].uriSAN: uriSAN \"spiffe://x/a\" is already listed at tenants[0].clientCertificates[0].uriSAN"}},
		{"every error at once", "tenants:\n  - id: \"\"\n  - id: b\n    tokens: [{sha256: abc}]\n    providers: [\"\"]\n",
			[]string{"tenants[0].id: must not be empty", "tenants[1].providers[0]: must not be empty", "tenants[1].tokens[0].sha256: must be 64 hex digits"}},
	} {
		_, err := auth.Parse([]byte(tc.file))
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		msg := err.Error()
		rest := msg
		for _, w := range tc.want {
			i := strings.Index(rest, w)
			if i < 0 {
				t.Errorf("%s: error %q, want %q (in this order: %q)", tc.name, msg, w, tc.want)
				break
			}
			rest = rest[i+len(w):]
		}
		if strings.Contains(msg, tokenA) {
			t.Errorf("%s: error quotes the token: %q", tc.name, msg)
		}
	}
}

// TestParseAccepts: what is allowed that a strict reader might refuse.
func TestParseAccepts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, file string }{
		{"a tenant without credentials (locked out, kept on file)", "tenants: [{id: a}]\n"},
		{"tokens and certificates null", "tenants:\n  - id: a\n    tokens:\n    clientCertificates:\n"},
		{"JSON", `{"tenants": [{"id": "a", "tokens": [{"sha256": "` + hashA + `"}]}]}`},
		{"a leading document marker", "---\ntenants: [{id: a}]\n"},
		{"ids with spaces and non-ASCII", "tenants: [{id: \"équipe A\"}]\n"},
		{"a wildcard DNS SAN", "tenants:\n  - id: a\n    clientCertificates: [{dnsSAN: \"*.a.internal\"}]\n"},
		{"the same name as a uri, a dns name and a cn", "tenants:\n  - id: a\n    clientCertificates: [{uriSAN: \"x:a\"}, {commonName: \"x:a\"}]\n"},
	} {
		if _, err := auth.Parse([]byte(tc.file)); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// TestLoad: Load reads a file (through a symlink, as a mounted Secret
// is), and refuses a missing or oversized one without repeating its path.
func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "credentials.yaml")
	if err := os.WriteFile(path, []byte(exampleFile), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.yaml")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if c, err := auth.Load(link); err != nil || c.TenantForToken(tokenA) == nil {
		t.Fatalf("Load through a symlink: %v", err)
	}
	missing := filepath.Join(dir, "missing.yaml")
	if _, err := auth.Load(missing); err == nil || err.Error() != "cannot read: no such file or directory" {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte("# "+strings.Repeat("x", auth.MaxFileBytes)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized file: %v", err)
	}
}

func TestReadToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want string
		bad      bool
	}{
		{in: tokenA, want: tokenA},
		{in: tokenA + "\n", want: tokenA},
		{in: tokenA + "\r\n", want: tokenA},
		{in: "", bad: true},
		{in: "\n", bad: true},
		{in: tokenA + "\n\n", bad: true},
		{in: "two words", bad: true},
		{in: "tab\there", bad: true},
		{in: "naïve", bad: true},
		{in: strings.Repeat("x", 5000), bad: true},
	} {
		got, err := auth.ReadToken(strings.NewReader(tc.in))
		if tc.bad != (err != nil) || got != tc.want {
			t.Errorf("ReadToken(%q) = %q, %v", tc.in, got, err)
		}
	}
}
