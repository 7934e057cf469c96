//go:build race

package retrydtest

// raceEnabled builds the server with the race detector when the tests run
// with -race, so the server's own data races fail the test too.
const raceEnabled = true
