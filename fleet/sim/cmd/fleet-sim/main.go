// Command fleet-sim runs the fleet simulation of docs/fleet.md — 1 000
// simulated agent loops against a provider that fails for 60 s, with and
// without retryd's fleet protection — prints its table, and writes the
// table into docs/fleet.md and the plot into docs/fleet-retries.svg.
//
//	go run ./fleet/sim/cmd/fleet-sim            # from the repository root
//	go run ./fleet/sim/cmd/fleet-sim -docs ''   # print the table only
//
// The simulation runs on a simulated clock and takes well under a second,
// so there is nothing to cancel: no signal handling.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/retryd/retryd/fleet/sim"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fleet-sim:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("fleet-sim", flag.ContinueOnError)
	docs := fs.String("docs", "docs", "directory holding fleet.md, where fleet-retries.svg is written; empty: print only")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rows := sim.Report()
	table := sim.Table(rows)
	fmt.Fprint(stdout, table)
	if *docs == "" {
		return nil
	}
	md := filepath.Join(*docs, "fleet.md")
	doc, err := os.ReadFile(md)
	if err != nil {
		return err
	}
	updated, err := sim.UpdateDoc(string(doc), table)
	if err != nil {
		return fmt.Errorf("%s: %w", md, err)
	}
	if err := os.WriteFile(md, []byte(updated), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*docs, "fleet-retries.svg"), sim.Plot(rows), 0o644)
}
