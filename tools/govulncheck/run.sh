#!/usr/bin/env bash
# Runs the pinned govulncheck over the module with a vulnerability database
# built on this machine, so it needs only the Go module proxy — not
# vuln.go.dev, which CI cannot reach.
#
# The data: golang.org/x/vulndb is the repository the Go vulnerability
# database is generated from, and its module zip (from the proxy, checked
# against go.sum like any module) carries data/osv/GO-*.json, one OSV
# record per vulnerability. x/vulndb's own cmd/indexdb turns that folder
# into the v1 database layout (index/, ID/) that `govulncheck -db file://`
# reads. Both tools and the data are pinned in tools/govulncheck/go.mod.
#
# Freshness: the database is exactly as new as the pinned x/vulndb
# pseudo-version. Refresh it with
#   go get -modfile=tools/govulncheck/go.mod golang.org/x/vulndb@latest
# and commit go.mod and go.sum (`run.sh` prints the snapshot's date).
#
# Usage: tools/govulncheck/run.sh [govulncheck flags] [packages]
#        (without arguments: ./... of every Go module, via
#        tools/each-go-module)
set -euo pipefail
cd "$(dirname "$0")/../.."

modfile=tools/govulncheck/go.mod
go mod download -modfile="$modfile" golang.org/x/vulndb
vulndb=$(go list -modfile="$modfile" -m -f '{{.Dir}}' golang.org/x/vulndb)
version=$(go list -modfile="$modfile" -m -f '{{.Version}} ({{.Time}})' golang.org/x/vulndb)
if [ ! -d "$vulndb/data/osv" ]; then
  echo "govulncheck: $vulndb has no data/osv: the x/vulndb layout changed" >&2
  exit 1
fi

db=$(mktemp -d)
trap 'rm -rf "$db"' EXIT
go tool -modfile="$modfile" indexdb -vulns "$vulndb/data/osv" -out "$db"
echo "vulnerability database: golang.org/x/vulndb $version, $(ls "$vulndb/data/osv" | wc -l) records" >&2

if [ $# -eq 0 ]; then
  # Each module is scanned from its own directory, with its own
  # requirements; the tool still comes from the pinned tools module.
  tools/each-go-module go tool -modfile="$PWD/$modfile" govulncheck -db "file://$db" ./...
  exit
fi
go tool -modfile="$modfile" govulncheck -db "file://$db" "$@"
