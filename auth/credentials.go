// Package auth decides who calls retryd: it loads the credentials file
// (tenants, the SHA-256 hashes of their bearer tokens, the client
// certificate identities that authenticate as them, and what each may
// use), reloads it when it changes, and provides the gRPC interceptors that
// put the authenticated tenant into the call's context with
// tenant.NewContext.
//
// The credentials file is YAML, usually mounted from a Kubernetes Secret:
//
//	tenants:
//	  - id: team-a
//	    tokens:
//	      - sha256: "c3de92e0c6019a2529fd5585bedab434fe15d64b7377f3db88eba798380b6638"
//	    providers: [openai, deepseek]   # absent: any provider
//	    policies: [interactive]         # absent: any named policy
//	    clientCertificates:             # mTLS identities of this tenant
//	      - uriSAN: "spiffe://example.org/team-a"
//	      - dnsSAN: "agents.team-a.internal"
//	      - commonName: "team-a-agents"
//
// Why hashes. The file stores SHA-256(token), never the token: a leaked
// file, backup or `kubectl get secret -o yaml` does not leak a usable
// credential. The hash is unsalted and fast on purpose: it only has to
// resist inverting a high-entropy random value, not guessing a
// human-chosen password, so tokens must be random and long — at least 128
// bits from a CSPRNG (`openssl rand -hex 32` gives 256). A slow salted
// hash (bcrypt, argon2) would add milliseconds to every call and buy
// nothing for such tokens.
package auth

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/retryd/retryd/tenant"
	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// Bounds of a credentials file.
const (
	// MaxFileBytes bounds the file: a Kubernetes Secret holds at most
	// 1 MiB, and a bound keeps a runaway file from holding memory.
	MaxFileBytes = 1 << 20
	// MaxTenantIDLen bounds a tenant id, and every provider, policy name
	// and certificate identity of the file. It is the bound of session
	// ids (service.MaxSessionIDLen): tenant ids namespace the same state.
	MaxTenantIDLen = 256
	// MinTokenLen is the shortest bearer token `retryd hash-token` takes
	// without a warning: 22 characters hold 128 bits in base64, 32 in hex.
	MinTokenLen = 22
)

// Credentials is a validated credentials file: its tenants and the
// credentials that authenticate as each. It is immutable; a reload builds a
// new one.
type Credentials struct {
	tenants []*tenant.Tenant
	counts  []Summary // per tenant, in file order
	tokens  []tokenHash
	// Client certificate identities, by kind, in the order they are
	// tried: URI SAN, DNS SAN (lower case), Subject common name.
	byURI, byDNS, byCN map[string]*tenant.Tenant
}

// emptyTokenHash is SHA-256(""), refused in a file.
var emptyTokenHash = sha256.Sum256(nil)

type tokenHash struct {
	sum    [sha256.Size]byte
	tenant int // index into tenants
}

// Summary describes one tenant of a credentials file without its secrets,
// for `retryd check-credentials` and logs.
type Summary struct {
	// ID is the tenant id.
	ID string
	// Tokens is how many token hashes the tenant has.
	Tokens int
	// ClientCertificates is how many certificate identities map to it.
	ClientCertificates int
	// Providers and Policies are its allow-lists; nil means any.
	Providers, Policies []string
}

// Summaries describes every tenant, in file order.
func (c *Credentials) Summaries() []Summary {
	out := make([]Summary, len(c.counts))
	for i, s := range c.counts {
		s.Providers, s.Policies = slices.Clone(s.Providers), slices.Clone(s.Policies)
		out[i] = s
	}
	return out
}

// Len returns how many tenants, token hashes and certificate identities
// the file holds.
func (c *Credentials) Len() (tenants, tokens, certificates int) {
	return len(c.tenants), len(c.tokens), len(c.byURI) + len(c.byDNS) + len(c.byCN)
}

// HashToken returns the lower-case hex SHA-256 of token: what the
// credentials file stores for it (the same as `printf %s TOKEN | sha256sum`).
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// TenantForToken returns the tenant whose token hash matches token, or nil.
// The tenant is shared by every call it authenticates: do not modify it.
//
// The presented token is hashed and compared with every stored hash in
// constant time, without stopping at a match, so neither the comparison
// nor the position of the matching entry shows in the response time.
// Comparing hashes already removes most of a timing oracle (an attacker
// controls the token, not its hash), but constant time costs nothing here.
func (c *Credentials) TenantForToken(token string) *tenant.Tenant {
	sum := sha256.Sum256([]byte(token))
	found := -1
	for _, h := range c.tokens {
		eq := subtle.ConstantTimeCompare(sum[:], h.sum[:])
		found = subtle.ConstantTimeSelect(eq, h.tenant, found)
	}
	if found < 0 {
		return nil
	}
	return c.tenants[found]
}

// ErrAmbiguousCertificate is returned by TenantForCertificate for a
// certificate whose identities name more than one tenant at the first kind
// that matches: retryd refuses to pick one.
var ErrAmbiguousCertificate = errors.New("auth: the client certificate's identities name more than one tenant")

// TenantForCertificate returns the tenant a verified client certificate
// authenticates as, and the identity that decided it (e.g.
// "uriSAN spiffe://example.org/team-a"), or nil when no identity of the
// certificate is in the file.
//
// The kinds are tried in a fixed order and the first kind with a match
// decides: URI SANs (e.g. SPIFFE ids, which are made to name workloads),
// then DNS SANs (compared case-insensitively), then the Subject common
// name (legacy; only when no SAN matched). A certificate whose identities
// of the deciding kind name two tenants is refused with
// ErrAmbiguousCertificate.
func (c *Credentials) TenantForCertificate(cert *x509.Certificate) (*tenant.Tenant, string, error) {
	if cert == nil {
		return nil, "", nil
	}
	uris := make([]string, 0, len(cert.URIs))
	for _, u := range cert.URIs {
		uris = append(uris, u.String())
	}
	dns := make([]string, 0, len(cert.DNSNames))
	for _, d := range cert.DNSNames {
		dns = append(dns, strings.ToLower(d))
	}
	for _, kind := range []struct {
		name  string
		index map[string]*tenant.Tenant
		ids   []string
	}{
		{kindURISAN, c.byURI, uris},
		{kindDNSSAN, c.byDNS, dns},
		{kindCommonName, c.byCN, []string{cert.Subject.CommonName}},
	} {
		var found *tenant.Tenant
		var matched string
		for _, id := range kind.ids {
			t, ok := kind.index[id]
			if !ok {
				continue
			}
			if found != nil && found != t {
				return nil, "", ErrAmbiguousCertificate
			}
			found, matched = t, kind.name+" "+id
		}
		if found != nil {
			return found, matched, nil
		}
	}
	return nil, "", nil
}

// Load reads and validates a credentials file. A missing, unreadable,
// oversized or invalid file is an error; read errors say "cannot read"
// without repeating the path, which the caller names.
func Load(path string) (*Credentials, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data)
}

// readFile reads at most MaxFileBytes of path.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read: %w", unwrapPath(err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read: %w", unwrapPath(err))
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxFileBytes)
	}
	return data, nil
}

// unwrapPath drops the *fs.PathError around err: the caller names the file.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// FieldError is an invalid part of a credentials file, named by its path,
// e.g. "tenants[2].tokens[0].sha256".
type FieldError struct {
	// Field is the path of the offending value.
	Field string
	// Message says what is wrong with it; it never quotes a token.
	Message string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

// The keys of the file. The certificate kinds double as the names
// TenantForCertificate reports.
const (
	kindURISAN     = "uriSAN"
	kindDNSSAN     = "dnsSAN"
	kindCommonName = "commonName"
)

// Parse validates the YAML (or JSON) content of a credentials file. It is
// strict, so a typo never silently weakens or widens access: unknown keys,
// keys given twice, more than one YAML document, values of the wrong type,
// duplicate tenant ids, a token hash or certificate identity listed twice
// (in one tenant or two) and malformed values are all errors, reported
// together with the path of each.
func Parse(data []byte) (*Credentials, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxFileBytes)
	}
	// Strict: a key given twice is an error, not a silent override.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	if multipleDocuments(data) {
		return nil, errors.New("more than one YAML document (a line \"---\" inside the file): want one")
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var root any
	if err := dec.Decode(&root); err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	p := &parser{creds: &Credentials{
		byURI: map[string]*tenant.Tenant{}, byDNS: map[string]*tenant.Tenant{}, byCN: map[string]*tenant.Tenant{},
	}}
	p.file(root)
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return p.creds, nil
}

// multipleDocuments reports whether data holds a YAML document after the
// first, which the JSON conversion would silently drop (tenants appended
// after a "---" would never authenticate). Anything after the first
// document that does not parse counts as a second one; an error in the
// first is left to the JSON conversion to report.
func multipleDocuments(data []byte) bool {
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	var first yamlv3.Node
	if err := dec.Decode(&first); err != nil {
		return false
	}
	var second yamlv3.Node
	return !errors.Is(dec.Decode(&second), io.EOF)
}

// parser walks the decoded file, collecting every error with its path.
type parser struct {
	creds *Credentials
	errs  []error
	ids   map[string]string // tenant id → the path that defined it
	// Who claimed each token hash and certificate identity, for the
	// error that names both places.
	tokenAt map[[sha256.Size]byte]string
	certAt  map[string]string
}

func (p *parser) bad(field, format string, args ...any) {
	p.errs = append(p.errs, &FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// object checks that v is a mapping with only the allowed keys.
func (p *parser) object(field string, v any, allowed ...string) (map[string]any, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		if field == "" {
			p.bad("(top level)", "must be a mapping with a tenants list, got %s", typeName(v))
		} else {
			p.bad(field, "must be a mapping, got %s", typeName(v))
		}
		return nil, false
	}
	for _, k := range sortedKeys(m) {
		if !slices.Contains(allowed, k) {
			p.bad(keyPath(field, k), "unknown field (want %s)", strings.Join(allowed, ", "))
		}
	}
	return m, true
}

func (p *parser) file(root any) {
	if root == nil {
		p.bad("tenants", "required: the file is empty")
		return
	}
	m, ok := p.object("", root, "tenants")
	if !ok {
		return
	}
	raw, present := m["tenants"]
	list, ok := raw.([]any)
	switch {
	case !present || raw == nil:
		p.bad("tenants", "required: a list of at least one tenant")
		return
	case !ok:
		p.bad("tenants", "must be a list, got %s", typeName(raw))
		return
	case len(list) == 0:
		p.bad("tenants", "must list at least one tenant (with none, every call would be refused)")
		return
	}
	p.ids = map[string]string{}
	p.tokenAt = map[[sha256.Size]byte]string{}
	p.certAt = map[string]string{}
	for i, t := range list {
		p.tenant(fmt.Sprintf("tenants[%d]", i), t)
	}
}

func (p *parser) tenant(field string, v any) {
	m, ok := p.object(field, v, "id", "tokens", "providers", "policies", "clientCertificates")
	if !ok {
		return
	}
	t := &tenant.Tenant{}
	idx := len(p.creds.tenants)
	id, ok := p.label(field+".id", m["id"])
	if ok {
		if prev, dup := p.ids[id]; dup {
			p.bad(field+".id", "tenant %q is already defined at %s", id, prev)
		} else {
			p.ids[id] = field
		}
	}
	t.ID = id
	summary := Summary{ID: id}
	t.Providers = p.allowList(field+".providers", m, "providers")
	t.Policies = p.allowList(field+".policies", m, "policies")
	summary.Providers, summary.Policies = slices.Clone(t.Providers), slices.Clone(t.Policies)

	for i, tok := range p.list(field+".tokens", m["tokens"]) {
		at := fmt.Sprintf("%s.tokens[%d]", field, i)
		tm, ok := p.object(at, tok, "sha256")
		if !ok {
			continue
		}
		sum, ok := p.hash(at+".sha256", tm["sha256"])
		if !ok {
			continue
		}
		if prev, dup := p.tokenAt[sum]; dup {
			p.bad(at+".sha256", "the same token hash is already listed at %s: a token authenticates one tenant", prev)
			continue
		}
		p.tokenAt[sum] = at + ".sha256"
		p.creds.tokens = append(p.creds.tokens, tokenHash{sum: sum, tenant: idx})
		summary.Tokens++
	}
	for i, c := range p.list(field+".clientCertificates", m["clientCertificates"]) {
		at := fmt.Sprintf("%s.clientCertificates[%d]", field, i)
		if p.certificate(at, c, t) {
			summary.ClientCertificates++
		}
	}
	p.creds.tenants = append(p.creds.tenants, t)
	p.creds.counts = append(p.creds.counts, summary)
}

// certificate adds one certificate identity of t; it reports whether the
// entry was valid.
func (p *parser) certificate(field string, v any, t *tenant.Tenant) bool {
	m, ok := p.object(field, v, kindURISAN, kindDNSSAN, kindCommonName)
	if !ok {
		return false
	}
	var kinds []string
	for _, k := range []string{kindURISAN, kindDNSSAN, kindCommonName} {
		if _, ok := m[k]; ok {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) != 1 {
		p.bad(field, "must have exactly one of uriSAN, dnsSAN or commonName, got %d", len(kinds))
		return false
	}
	kind := kinds[0]
	at := field + "." + kind
	value, ok := p.label(at, m[kind])
	if !ok {
		return false
	}
	index := p.creds.byCN
	switch kind {
	case kindURISAN:
		if msg := checkURI(value); msg != "" {
			p.bad(at, "%s", msg)
			return false
		}
		index = p.creds.byURI
	case kindDNSSAN:
		if msg := checkDNSName(value); msg != "" {
			p.bad(at, "%s", msg)
			return false
		}
		value = strings.ToLower(value)
		index = p.creds.byDNS
	}
	key := kind + " " + value
	if prev, dup := p.certAt[key]; dup {
		p.bad(at, "%s %q is already listed at %s: a certificate identity authenticates one tenant", kind, value, prev)
		return false
	}
	p.certAt[key] = at
	index[value] = t
	return true
}

// list returns v as a list; absent or null is an empty list.
func (p *parser) list(field string, v any) []any {
	if v == nil {
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		p.bad(field, "must be a list, got %s", typeName(v))
		return nil
	}
	return l
}

// allowList decodes an optional list of names: absent means any (nil), a
// list (even empty) means exactly those. An explicit null is refused
// rather than read as "any": `providers:` with its items forgotten must
// not open every provider.
func (p *parser) allowList(field string, m map[string]any, key string) []string {
	v, present := m[key]
	if !present {
		return nil
	}
	if v == nil {
		p.bad(field, "is null: list the allowed names, write [] for none, or leave the key out for any")
		return []string{}
	}
	l, ok := v.([]any)
	if !ok {
		p.bad(field, "must be a list, got %s", typeName(v))
		return []string{}
	}
	out := make([]string, 0, len(l))
	seen := make(map[string]bool, len(l))
	for i, e := range l {
		at := fmt.Sprintf("%s[%d]", field, i)
		s, ok := p.label(at, e)
		if !ok {
			continue
		}
		if seen[s] {
			p.bad(at, "%q is listed twice", s)
			continue
		}
		seen[s] = true
		out = append(out, s)
	}
	return out
}

// label checks an identifier-like string with the rules of session ids:
// non-empty, at most MaxTenantIDLen bytes, valid UTF-8, no control
// characters.
func (p *parser) label(field string, v any) (string, bool) {
	if v == nil {
		p.bad(field, "required")
		return "", false
	}
	s, ok := v.(string)
	if !ok {
		p.bad(field, "must be a string, got %s (quote it)", typeName(v))
		return "", false
	}
	if msg := checkLabel(s); msg != "" {
		p.bad(field, "%s", msg)
		return "", false
	}
	return s, true
}

// checkLabel returns why s is not a valid label, or "".
func checkLabel(s string) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > MaxTenantIDLen:
		return fmt.Sprintf("must be at most %d bytes, got %d", MaxTenantIDLen, len(s))
	case !utf8.ValidString(s):
		return "must be valid UTF-8"
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return "must not contain control characters"
	}
	return ""
}

// hash decodes a token's hex SHA-256. The message never quotes the value:
// someone may have pasted the token itself.
func (p *parser) hash(field string, v any) ([sha256.Size]byte, bool) {
	var sum [sha256.Size]byte
	s, ok := v.(string)
	switch {
	case v == nil:
		p.bad(field, "required: the hex SHA-256 of the token (retryd hash-token)")
		return sum, false
	case !ok:
		p.bad(field, "must be a string, got %s (quote it)", typeName(v))
		return sum, false
	case len(s) != 2*sha256.Size:
		p.bad(field, "must be %d hex digits (a SHA-256), got %d characters; store the hash (retryd hash-token), never the token", 2*sha256.Size, len(s))
		return sum, false
	}
	if _, err := hex.Decode(sum[:], []byte(s)); err != nil {
		p.bad(field, "must be %d hex digits (a SHA-256): not hexadecimal", 2*sha256.Size)
		return sum, false
	}
	if sum == emptyTokenHash {
		// An empty token is never accepted, so this entry could never
		// match: the hash was taken of nothing.
		p.bad(field, "is the SHA-256 of the empty string: the token never reached the hash")
		return sum, false
	}
	return sum, true
}

// checkURI returns why s is not an absolute URI as it appears in a URI
// SAN, or "".
func checkURI(s string) string {
	scheme, rest, ok := strings.Cut(s, ":")
	if !ok || scheme == "" || rest == "" || strings.ContainsAny(s, " \t") {
		return "must be an absolute URI, e.g. spiffe://example.org/team-a"
	}
	for i, r := range scheme {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.')) {
			return "must be an absolute URI, e.g. spiffe://example.org/team-a"
		}
	}
	return ""
}

// checkDNSName returns why s is not a DNS name as it appears in a DNS SAN
// (letters, digits, '-', '_', '.', and '*' for a wildcard), or "".
func checkDNSName(s string) string {
	if len(s) > 253 {
		return "must be a DNS name of at most 253 bytes"
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == '*') {
			return "must be a DNS name (letters, digits, '-', '_', '.', '*')"
		}
	}
	return ""
}

// keyPath is the path of key k under field; a key that is not a plain
// word is quoted (and cut short), so a stray value cannot garble the error.
func keyPath(field, k string) string {
	plain := k != "" && len(k) <= 64 && strings.IndexFunc(k, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
	}) < 0
	if !plain {
		if len(k) > 64 {
			k = k[:64] + "…"
		}
		k = strconv.Quote(k)
	}
	if field == "" {
		return k
	}
	return field + "." + k
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	}
	return fmt.Sprintf("%T", v)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
