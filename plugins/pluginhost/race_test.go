//go:build race

package pluginhost_test

const raceEnabled = true
