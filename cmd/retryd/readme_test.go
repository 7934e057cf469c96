package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/retryd/retryd/internal/retrydtest"
)

// walkStep is one command of a documented walk-through and the output
// the document shows for it.
type walkStep struct {
	command, output string
}

// readmeCommands returns the commands of the section of a Markdown
// document under heading (up to the next heading of level 1 to 3), in
// order: in each ```sh block, a command begins at a line "$ " and ends at
// the first line that names the server's address or ends with " &" (every
// command of the sections tested ends so); the lines up to the next
// command are its output.
func readmeCommands(t *testing.T, doc, heading string) []walkStep {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("the document has no %q", heading)
	}
	section := doc[i+len(heading)+2:]
	if loc := nextHeading.FindStringIndex(section); loc != nil {
		section = section[:loc[0]]
	}
	var steps []walkStep
	blocks := strings.Split(section, "```")
	for b := 1; b < len(blocks); b += 2 { // the odd parts are inside fences
		lines := strings.Split(strings.TrimPrefix(blocks[b], "sh\n"), "\n")
		for k := 0; k < len(lines); k++ {
			if !strings.HasPrefix(lines[k], "$ ") {
				continue
			}
			cmd := []string{strings.TrimPrefix(lines[k], "$ ")}
			for !strings.Contains(lines[k], "localhost:7700") && !strings.HasSuffix(lines[k], " &") && k+1 < len(lines) {
				k++
				cmd = append(cmd, lines[k])
			}
			var out []string
			for k+1 < len(lines) && !strings.HasPrefix(lines[k+1], "$ ") {
				k++
				out = append(out, lines[k])
			}
			steps = append(steps, walkStep{strings.Join(cmd, "\n"), strings.Join(out, "\n")})
		}
	}
	return steps
}

var (
	// nextHeading matches the heading that ends a section (not a shell
	// comment in a code block).
	nextHeading = regexp.MustCompile(`\n#{1,3} `)
	// retryIDPattern matches a whole retry id (26 characters of base32).
	retryIDPattern = regexp.MustCompile(`\b[A-Z2-7]{26}\b`)
	// shownField matches a field a document shows with a scalar value,
	// quoted (JSON) or not (grpcurl's error details): key, value.
	shownField = regexp.MustCompile(`"?([A-Za-z_][A-Za-z0-9_]*)"?: ("(?:[^"\\]|\\.)*"|-?[0-9][0-9.]*\b|true\b|false\b)`)
)

// volatileFields differ from run to run: ids (mapped, not compared), times
// and jittered delays.
var volatileFields = map[string]bool{"retryId": true, "dueAt": true, "startedAt": true, "time": true, "delayMs": true}

// expectations lists what an output a document shows promises: for every
// field shown with a scalar value (but the volatile ones), a pattern the
// real output must match; for every line of plain text ("ERROR:", "Code:
// …", the verifier's summary), that line. A value or line cut short with
// "…" promises its beginning only.
func expectations(shown string) (fields []*regexp.Regexp, lines []string) {
	for _, m := range shownField.FindAllStringSubmatch(shown, -1) {
		key, value := m[1], m[2]
		if volatileFields[key] {
			continue
		}
		pattern := regexp.QuoteMeta(`"`+key+`": `) + regexp.QuoteMeta(value) + `(?:[,}\]\s]|$)`
		if cut, ok := strings.CutSuffix(value, `…"`); ok {
			pattern = regexp.QuoteMeta(`"` + key + `": ` + cut)
		}
		fields = append(fields, regexp.MustCompile(pattern))
	}
	for _, line := range strings.Split(shown, "\n") {
		line = strings.TrimSpace(line)
		if strings.ContainsAny(line, `{}"`) || !strings.ContainsFunc(line, unicode.IsLetter) {
			continue
		}
		line, _, _ = strings.Cut(line, "…")
		lines = append(lines, line)
	}
	return fields, lines
}

// TestREADMEWalkthrough runs the README's grpcurl walk-through as a new
// user would (see runDocSection).
func TestREADMEWalkthrough(t *testing.T) {
	runDocSection(t, "README.md", "### Walk-through with grpcurl", 7)
}

// TestAdmissionExample runs the example of admission control in
// docs/operations.md: a server started with a bound of one pending retry,
// which schedules one and refuses the next.
func TestAdmissionExample(t *testing.T) {
	runDocSection(t, "docs/operations.md", "### Admission control", 3)
}

// runDocSection runs the commands of a section of the document at path
// (relative to the repository's root), in order,
// against the built server: the pinned grpcurl for `grpcurl`, the built
// binary for `go run ./cmd/retryd`, a server of the test's on a free port
// for localhost:7700 (started with the flags of a first command `go run
// ./cmd/retryd --listen … &`, if the section has one), and the retry ids
// this server handed out for those the document shows. Every field it
// shows (but ids, times and jittered delays) must be in the real
// answer, and every line of plain text in the real output; then the
// invariant checker runs over the log. want is how many commands the
// section had when its test was written: fewer means the parser no longer
// finds them.
func runDocSection(t *testing.T, path, heading string, want int) {
	if testing.Short() {
		t.Skip("builds the pinned grpcurl and the server")
	}
	t.Parallel()
	root, err := retrydtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
	if err != nil {
		t.Fatal(err)
	}
	steps := readmeCommands(t, string(doc), heading)
	if len(steps) < want {
		t.Fatalf("found %d commands under %q in %s, want the %d it had when this test was written: is the parser still right?", len(steps), heading, path, want)
	}
	grpcurl, err := retrydtest.PinnedTool("tools/protoc/go.mod", "grpcurl")
	if err != nil {
		t.Fatal(err)
	}
	retryd := retrydtest.Binary(t)
	var flags []string
	if first := steps[0].command; strings.HasPrefix(first, "go run ./cmd/retryd --listen ") && strings.HasSuffix(first, " &") {
		// The test starts the server itself, on a free port.
		flags = strings.Fields(strings.TrimSuffix(strings.TrimPrefix(first, "go run ./cmd/retryd --listen "), " &"))[1:]
		steps = steps[1:]
	}
	srv := retrydtest.Start(t, flags...)

	ids := map[string]string{} // the document's retry ids → this server's
	checked := 0
	for n, step := range steps {
		cmd := strings.ReplaceAll(step.command, "localhost:7700", srv.Addr)
		cmd = strings.Replace(cmd, "go run ./cmd/retryd", retryd, 1)
		for shown, real := range ids {
			cmd = strings.ReplaceAll(cmd, shown, real)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		run := exec.CommandContext(ctx, "bash", "-c", `grpcurl() { "$GRPCURL" "$@"; }`+"\n"+cmd)
		run.Env = append(os.Environ(), "GRPCURL="+grpcurl)
		run.Dir = root
		out, err := run.CombinedOutput()
		cancel()
		name := fmt.Sprintf("command %d (%s)", n+1, firstLine(step.command))
		if wantErr := strings.HasPrefix(strings.TrimSpace(step.output), "ERROR:"); (err != nil) != wantErr {
			t.Errorf("%s: exit %v, want failure %v\n%s", name, err, wantErr, out)
			continue
		}
		shownIDs, realIDs := firstAppearances(step.output), firstAppearances(string(out))
		if len(shownIDs) > len(realIDs) {
			t.Errorf("%s: %s shows retry ids %v, the server answered %v", name, path, shownIDs, realIDs)
		}
		for i := range min(len(shownIDs), len(realIDs)) {
			ids[shownIDs[i]] = realIDs[i]
		}
		fields, lines := expectations(step.output)
		if len(fields)+len(lines) == 0 {
			t.Errorf("%s: %s shows nothing to check", name, path)
		}
		for _, f := range fields {
			if !f.Match(out) {
				t.Errorf("%s: %s shows %s; the server answered:\n%s", name, path, f, out)
			}
		}
		for _, l := range lines {
			if !bytes.Contains(out, []byte(l)) {
				t.Errorf("%s: %s shows %q; the output was:\n%s", name, path, l, out)
			}
		}
		checked += len(fields) + len(lines)
	}
	t.Logf("%d commands, %d shown fields and lines checked", len(steps), checked)
	retrydtest.Verify(t, srv.Conn(t))
}

// firstAppearances lists the retry ids in s, each once, in order.
func firstAppearances(s string) []string {
	var ids []string
	seen := map[string]bool{}
	for _, id := range retryIDPattern.FindAllString(s, -1) {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
