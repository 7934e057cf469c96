package sim

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Row is one line of the docs' table: a fleet of agents with one policy,
// under one protection, against the failing provider.
type Row struct {
	Policy     string // the agents' policy, as the table names it
	Protection string
	Result     ProviderResult
}

// Report runs the outage for the seeds' normal and always modes
// under every Protection and returns one Row per run, in table order. Each
// run gets a fresh Local with seed 7.
func Report() []Row {
	var rows []Row
	for _, pol := range []struct {
		name   string
		policy Scenario
	}{{"normal", Outage(NormalPolicy)}, {"always", Outage(AlwaysPolicy)}} {
		for _, pr := range Protections() {
			res := Run(pol.policy, NewLocal(pr.Config, 7)).Provider("deepseek")
			rows = append(rows, Row{Policy: pol.name, Protection: pr.Name, Result: res})
		}
	}
	return rows
}

// Table renders rows as the docs' Markdown table.
func Table(rows []Row) string {
	var b strings.Builder
	b.WriteString("| agents | fleet protection | first attempts | retries started | retries in the outage | retries per 100 first attempts in the outage | peak retries/s (at) | drain after recovery | delegated by the fleet |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		p := r.Result
		inOutage := Between(p.RetriesPerSecond, p.OutageStart, p.OutageEnd)
		firstInOutage := Between(p.FirstPerSecond, p.OutageStart, p.OutageEnd)
		peak, at := p.PeakRetries()
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.1f | %s (%d s) | %.1f s | %s |\n",
			r.Policy, r.Protection, thousands(p.FirstAttempts), thousands(p.RetriesStarted), thousands(inOutage),
			100*float64(inOutage)/float64(max(firstInOutage, 1)), thousands(peak), at,
			p.Drain.Seconds(), thousands(fleetDelegations(p)))
	}
	return b.String()
}

func fleetDelegations(p ProviderResult) int {
	n := 0
	for reason, c := range p.Delegated {
		if strings.HasPrefix(reason, "fleet_") {
			n += c
		}
	}
	return n + p.Cancelled
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + " " + s[i:]
	}
	return s
}

// plotSeries are the protections the plot draws, with their colours; "fleet,
// no spread" stays in the table (its one-second spike would flatten every
// other line).
var plotSeries = []struct{ protection, colour string }{
	{"policy only", "#d62728"},
	{"budget", "#1f77b4"},
	{"fleet (defaults)", "#2ca02c"},
}

// panel is one chart of the plot: one agents' policy, its y axis up to
// ymax (0: up to the highest value).
type panel struct {
	policy, title string
	ymax          int
}

// plotPanels: the normal-mode fleet's protected lines lie along the bottom
// of a chart scaled for its unprotected one, so it is drawn twice.
var plotPanels = []panel{
	{"normal", "normal mode agents", 0},
	{"normal", "normal mode agents, up to 100 retries/s", 100},
	{"always", "always mode agents", 0},
}

// Plot renders retries per second over time, one line per protection, in
// the panels above, as a self-contained SVG.
func Plot(rows []Row) []byte {
	const width, panelH, top, left, right, gap = 960, 200, 56, 64, 24, 64
	height := top + len(plotPanels)*(panelH+gap)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	b.WriteString(`<text x="64" y="22" font-size="15" font-weight="bold">Retries started per second against the failing provider (1 000 agents, failing 10–70 s)</text>` + "\n")
	for i, s := range plotSeries {
		x := left + i*220
		fmt.Fprintf(&b, `<line x1="%d" y1="40" x2="%d" y2="40" stroke="%s" stroke-width="2.5"/><text x="%d" y="44">%s</text>`+"\n",
			x, x+24, s.colour, x+30, s.protection)
	}
	for i, p := range plotPanels {
		y0 := top + i*(panelH+gap) + 28
		plotPanel(&b, rows, p, i, left, y0, width-left-right, panelH)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

func plotPanel(b *strings.Builder, rows []Row, p panel, id, x0, y0, w, h int) {
	var series [][]int
	var colours []string
	var outage [2]time.Duration
	for _, s := range plotSeries {
		for _, r := range rows {
			if r.Policy == p.policy && r.Protection == s.protection {
				series, colours = append(series, r.Result.RetriesPerSecond), append(colours, s.colour)
				outage = [2]time.Duration{r.Result.OutageStart, r.Result.OutageEnd}
			}
		}
	}
	if len(series) == 0 {
		return
	}
	seconds := len(series[0])
	ymax := p.ymax
	if ymax == 0 {
		for _, s := range series {
			for _, v := range s {
				ymax = max(ymax, v)
			}
		}
	}
	step := niceStep(ymax)
	if p.ymax == 0 {
		ymax = (ymax/step + 1) * step
	}
	xOf := func(s float64) float64 { return float64(x0) + s*float64(w)/float64(seconds) }
	yOf := func(v float64) float64 { return float64(y0+h) - v*float64(h)/float64(ymax) }

	fmt.Fprintf(b, `<clipPath id="panel%d"><rect x="%d" y="%d" width="%d" height="%d"/></clipPath>`+"\n", id, x0, y0, w, h)
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", x0, y0-8, p.title)
	ox0, ox1 := xOf(outage[0].Seconds()), xOf(outage[1].Seconds())
	fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#f2f2f2"/>`+"\n", ox0, y0, ox1-ox0, h)
	fmt.Fprintf(b, `<text x="%.1f" y="%d" fill="#777" text-anchor="end">provider failing</text>`+"\n", ox1, y0-8)
	for v := 0; v <= ymax; v += step {
		y := yOf(float64(v))
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%d</text>`+"\n",
			x0, y, x0+w, y, x0-6, y+4, v)
	}
	for s := 0; s <= seconds; s += 10 {
		x := xOf(float64(s))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999"/><text x="%.1f" y="%d" text-anchor="middle">%d s</text>`+"\n",
			x, y0+h, x, y0+h+4, x, y0+h+18, s)
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle" transform="rotate(-90 %d %d)">retries/s</text>`+"\n",
		x0-44, y0+h/2, x0-44, y0+h/2)
	for i, s := range series {
		var pts []string
		for sec, v := range s {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(float64(sec)+0.5), yOf(float64(v))))
		}
		fmt.Fprintf(b, `<polyline clip-path="url(#panel%d)" fill="none" stroke="%s" stroke-width="1.8" stroke-linejoin="round" points="%s"/>`+"\n",
			id, colours[i], strings.Join(pts, " "))
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", x0, y0, w, h)
}

// niceStep is a grid step of 1, 2 or 5 times a power of ten giving about
// five lines up to ymax.
func niceStep(ymax int) int {
	if ymax <= 5 {
		return 1
	}
	raw := float64(ymax) / 5
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return int(m * p)
		}
	}
	return int(10 * p)
}

// The markers around the generated table in docs/fleet.md.
const (
	TableBegin = "<!-- fleet-sim table: begin (generated by go run ./fleet/sim/cmd/fleet-sim; do not edit) -->"
	TableEnd   = "<!-- fleet-sim table: end -->"
)

// UpdateDoc returns doc with the text between TableBegin and TableEnd
// replaced by table.
func UpdateDoc(doc, table string) (string, error) {
	begin := strings.Index(doc, TableBegin)
	end := strings.Index(doc, TableEnd)
	if begin < 0 || end < begin {
		return "", fmt.Errorf("sim: the document has no %q … %q section", TableBegin, TableEnd)
	}
	return doc[:begin+len(TableBegin)] + "\n" + table + doc[end:], nil
}
