package app

import (
	"strings"
	"testing"
	"time"

	"github.com/effectline/effectline/store"
)

func TestConfigFromEnv(t *testing.T) {
	env := func(kv map[string]string) func(string) string {
		return func(k string) string { return kv[k] }
	}

	t.Run("defaults", func(t *testing.T) {
		c, err := FromEnv(env(nil))
		if err != nil {
			t.Fatal(err)
		}
		if c.DatabaseURL != DefaultDatabaseURL || c.HTTPAddr != DefaultHTTPAddr || c.HTTPAddrSet ||
			c.ShutdownGrace != DefaultShutdownGrace || c.CommitWindow != 0 || c.RelayWindow != 0 ||
			c.Retention != 720*time.Hour || c.TombstoneRetention != 0 {
			t.Fatalf("defaults: %+v", c)
		}
	})

	t.Run("retention", func(t *testing.T) {
		c, err := FromEnv(env(map[string]string{EnvRetention: "24h", EnvTombstoneRetention: "8760h"}))
		if err != nil || c.Retention != 24*time.Hour || c.TombstoneRetention != 8760*time.Hour {
			t.Fatalf("retention: %+v, %v", c, err)
		}
	})

	t.Run("commit window", func(t *testing.T) {
		for v, want := range map[string]time.Duration{"7ms": 7 * time.Millisecond, "0": -1, "0s": -1} {
			c, err := FromEnv(env(map[string]string{EnvCommitWindow: v}))
			if err != nil {
				t.Fatalf("%s=%s: %v", EnvCommitWindow, v, err)
			}
			if c.CommitWindow != want {
				t.Errorf("%s=%s: window %v, want %v", EnvCommitWindow, v, c.CommitWindow, want)
			}
		}
	})

	t.Run("relay window", func(t *testing.T) {
		for v, want := range map[string]time.Duration{"8ms": 8 * time.Millisecond, "0": 0} {
			c, err := FromEnv(env(map[string]string{EnvRelayWindow: v}))
			if err != nil || c.RelayWindow != want {
				t.Errorf("%s=%s: window %v, %v; want %v", EnvRelayWindow, v, c.RelayWindow, err, want)
			}
		}
	})

	t.Run("row format", func(t *testing.T) {
		for v, want := range map[string]store.RowFormat{"": store.Compact, "compact": store.Compact, "plain": store.Plain} {
			c, err := FromEnv(env(map[string]string{EnvRowFormat: v}))
			if err != nil || c.RowFormat != want {
				t.Errorf("%s=%q: %v, %v; want %v", EnvRowFormat, v, c.RowFormat, err, want)
			}
		}
	})

	t.Run("every bad value is named", func(t *testing.T) {
		bad := map[string]string{
			EnvKafkaPartitions:    "0",
			EnvKafkaReplication:   "many",
			EnvShutdownGrace:      "-1s",
			EnvExecutorLease:      "soon",
			EnvSweepInterval:      "0",
			EnvCommitWindow:       "2s",
			EnvRelayWindow:        "-4ms",
			EnvInsecureOpenAPI:    "maybe",
			EnvRetention:          "a month",
			EnvTombstoneRetention: "0",
			EnvRowFormat:          "old",
		}
		_, err := FromEnv(env(bad))
		if err == nil {
			t.Fatal("no error")
		}
		for name, v := range bad {
			if !strings.Contains(err.Error(), name+`="`+v+`"`) {
				t.Errorf("error does not name %s=%q:\n%v", name, v, err)
			}
		}
	})
}
