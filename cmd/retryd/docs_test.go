package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/retryd/retryd/internal/retrydtest"
)

// TestDocLinks checks every relative link of every Markdown file in the
// repository: the file or directory it names exists, and a #fragment names
// a heading of the target document (as GitHub makes anchors of headings).
func TestDocLinks(t *testing.T) {
	t.Parallel()
	root, err := retrydtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	docs, err := markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 10 {
		t.Fatalf("found %d Markdown files under %s; is the walk still right?", len(docs), root)
	}
	anchors := map[string]map[string]bool{} // document → its heading anchors
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		a := headingAnchors(string(b))
		anchors[path] = a
		return a, nil
	}
	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for _, l := range relativeLinks(string(b)) {
			checked++
			target, fragment, _ := strings.Cut(l.target, "#")
			path := doc
			if target != "" {
				path = filepath.Join(filepath.Dir(doc), filepath.FromSlash(target))
				info, err := os.Stat(path)
				if err != nil {
					t.Errorf("%s:%d: link %q: %v", rel, l.line, l.target, err)
					continue
				}
				if info.IsDir() || filepath.Ext(path) != ".md" {
					if fragment != "" {
						t.Errorf("%s:%d: link %q: a fragment on something that is not a Markdown file", rel, l.line, l.target)
					}
					continue
				}
			}
			if fragment == "" {
				continue
			}
			a, err := anchorsOf(path)
			if err != nil {
				t.Fatal(err)
			}
			if !a[fragment] {
				t.Errorf("%s:%d: link %q: no heading of %s has the anchor #%s", rel, l.line, l.target, filepath.Base(path), fragment)
			}
		}
	}
	t.Logf("%d Markdown files, %d relative links", len(docs), checked)
}

// markdownFiles lists the repository's Markdown files, leaving out what
// tools install (node_modules, Python virtual environments) and version
// control.
func markdownFiles(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", ".venv":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			out = append(out, path)
		}
		return nil
	})
	return out, err
}

type docLink struct {
	line   int
	target string
}

var (
	// inlineLink matches [text](target) and ![alt](target), with an
	// optional "title".
	inlineLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// codeSpan matches inline code, whose brackets are not links.
	codeSpan = regexp.MustCompile("`[^`]*`")
	// scheme matches a link with a URL scheme (https:, mailto:).
	scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// relativeLinks returns the links of a Markdown document that point into
// the repository, outside fenced code blocks and code spans.
func relativeLinks(doc string) []docLink {
	var out []docLink
	fenced := false
	for i, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			if target := m[1]; !scheme.MatchString(target) {
				out = append(out, docLink{line: i + 1, target: target})
			}
		}
	}
	return out
}

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown document: lower case, punctuation dropped, spaces as hyphens,
// and -1, -2, … on repeats.
func headingAnchors(doc string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimLeft(line, "#")
		if !strings.HasPrefix(text, " ") {
			continue
		}
		slug := anchorOf(strings.TrimSpace(text))
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// anchorOf is GitHub's anchor of a heading's text.
func anchorOf(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '_', r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func TestAnchorOf(t *testing.T) {
	t.Parallel()
	for heading, want := range map[string]string{
		"Walk-through with grpcurl":           "walk-through-with-grpcurl",
		"Timers, expiry and awaiters":         "timers-expiry-and-awaiters",
		"One FailedStep, through the layers":  "one-failedstep-through-the-layers",
		"`retryd verify` and the log's rules": "retryd-verify-and-the-logs-rules",
	} {
		if got := anchorOf(heading); got != want {
			t.Errorf("anchorOf(%q) = %q, want %q", heading, got, want)
		}
	}
}

// repoURL is where the repository's files are published; a runbook_url
// under it names a file of this repository.
const repoURL = "https://github.com/retryd/retryd/blob/main/"

// TestRunbookURLs checks the runbook_url of every alert of the shipped
// rules (deploy/observability/alerts.yaml, which the chart ships too): it
// is a file of this repository under repoURL, and its #fragment names a
// heading of that document, as TestDocLinks checks a Markdown link.
func TestRunbookURLs(t *testing.T) {
	t.Parallel()
	root, err := retrydtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(filepath.Join(root, "deploy", "observability", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	problems, alerts := runbookProblems(root, string(rules))
	if alerts == 0 {
		t.Fatal("alerts.yaml defines no alert")
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestRunbookURLsRefuseBadAnchor: the check finds a runbook_url whose
// anchor no heading has, one naming a missing document, one outside the
// repository, and an alert without any.
func TestRunbookURLsRefuseBadAnchor(t *testing.T) {
	t.Parallel()
	root, err := retrydtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rules := `groups:
  - name: retryd
    rules:
      - alert: Good
        annotations:
          runbook_url: ` + repoURL + `docs/runbooks.md#retryddown
      - alert: BadAnchor
        annotations:
          runbook_url: ` + repoURL + `docs/runbooks.md#retrydisdown
      - alert: NoDocument
        annotations:
          runbook_url: ` + repoURL + `docs/no-such-runbooks.md#retryddown
      - alert: Elsewhere
        annotations:
          runbook_url: https://example.com/runbooks#retryddown
      - alert: NoRunbook
        annotations:
          summary: nothing to read
`
	problems, alerts := runbookProblems(root, rules)
	if alerts != 5 {
		t.Errorf("found %d alerts, want 5", alerts)
	}
	want := []string{"BadAnchor", "NoDocument", "Elsewhere", "NoRunbook"}
	if len(problems) != len(want) {
		t.Fatalf("problems %q, want one for each of %v", problems, want)
	}
	for i, name := range want {
		if !strings.Contains(problems[i], "alert "+name+":") {
			t.Errorf("problem %d is %q, want one about %s", i, problems[i], name)
		}
	}
}

var (
	alertLine   = regexp.MustCompile(`^\s+- alert: (\S+)\s*$`)
	runbookLine = regexp.MustCompile(`^\s+runbook_url: ["']?([^"'\s]+)["']?\s*$`)
)

// runbookProblems checks the runbook_url annotation of every alert of a
// rule file and returns what is wrong, one line per alert, and how many
// alerts the file defines.
func runbookProblems(root, rules string) (problems []string, alerts int) {
	urls := map[string]string{}
	var order []string
	current := ""
	for _, line := range strings.Split(rules, "\n") {
		if m := alertLine.FindStringSubmatch(line); m != nil {
			current = m[1]
			order = append(order, current)
			continue
		}
		if m := runbookLine.FindStringSubmatch(line); m != nil && current != "" {
			urls[current] = m[1]
		}
	}
	for _, alert := range order {
		u, ok := urls[alert]
		if !ok {
			problems = append(problems, fmt.Sprintf("alert %s: no runbook_url annotation", alert))
			continue
		}
		rel, ok := strings.CutPrefix(u, repoURL)
		if !ok {
			problems = append(problems, fmt.Sprintf("alert %s: runbook_url %s is not under %s", alert, u, repoURL))
			continue
		}
		file, fragment, _ := strings.Cut(rel, "#")
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			problems = append(problems, fmt.Sprintf("alert %s: runbook_url %s: %v", alert, u, err))
			continue
		}
		if fragment == "" || !headingAnchors(string(b))[fragment] {
			problems = append(problems, fmt.Sprintf("alert %s: runbook_url %s: no heading of %s has the anchor #%s", alert, u, file, fragment))
		}
	}
	return problems, len(order)
}
