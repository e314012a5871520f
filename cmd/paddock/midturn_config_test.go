package main

import (
	"testing"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/config"
)

// TestConfigMidTurnReachesTheHostPolicy: policy.mid_turn and
// agents[].policy.mid_turn map onto the host policy that start and every
// reload (SetPolicy) install.
func TestConfigMidTurnReachesTheHostPolicy(t *testing.T) {
	cfg := config.Default()
	cfg.Policy.MidTurn = "steer"
	cfg.Agents = []config.AgentSpec{{Name: "strict", Policy: config.Policy{MidTurn: "reject"}}, {Name: "plain"}}
	p := policyFromConfig(cfg)
	if p.MidTurn != host.MidTurnSteer || p.For("nobody").MidTurn != host.MidTurnSteer {
		t.Errorf("default mid_turn %q, want steer", p.MidTurn)
	}
	if got := p.For("strict").MidTurn; got != host.MidTurnReject {
		t.Errorf("strict: %q, want reject", got)
	}
	if got := p.For("plain").MidTurn; got != host.MidTurnSteer {
		t.Errorf("plain: %q, want the default steer", got)
	}
}
