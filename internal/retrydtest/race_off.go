//go:build !race

package retrydtest

const raceEnabled = false
