package subjects

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestAgentPermissionsGolden(t *testing.T) {
	p, err := Default().AgentPermissions("a")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"agentbus.agent.*.*.a.*",
		"agentbus.agent.*.*.a.*.*.*",
		"agentbus.all.*.a.*",
		"agentbus.dlq.a.*.*",
	}
	for _, c := range []string{"p1", "p2", "p3", "p4", "p5", "b"} {
		filter := "agentbus.agent.a." + c + ".>"
		if c == "b" {
			filter = "agentbus.all.>"
		}
		want = append(want,
			"$JS.API.CONSUMER.CREATE.AGENTBUS.a_"+c+"."+filter,
			"$JS.API.CONSUMER.MSG.NEXT.AGENTBUS.a_"+c,
			"$JS.ACK.AGENTBUS.a_"+c+".>",
		)
	}
	want = append(want,
		"$JS.API.CONSUMER.CREATE.AGENTBUS.a_h.agentbus.agent.a.>",
		"$JS.API.CONSUMER.MSG.NEXT.AGENTBUS.a_h",
		"$JS.API.CONSUMER.DELETE.AGENTBUS.a_h",
		"$JS.API.CONSUMER.INFO.AGENTBUS.*",
		"$JS.API.DIRECT.GET.AGENTBUS.agentbus.agent.a.>",
		"$JS.API.DIRECT.GET.AGENTBUS.agentbus.agent.*.*.a.>",
		"$JS.API.CONSUMER.CREATE.AGENTBUS.a_hs.agentbus.agent.*.*.a.>",
		"$JS.API.CONSUMER.MSG.NEXT.AGENTBUS.a_hs",
		"$JS.API.CONSUMER.DELETE.AGENTBUS.a_hs",
		"$JS.API.CONSUMER.CREATE.AGENTBUS.a_ha.agentbus.all.>",
		"$JS.API.CONSUMER.MSG.NEXT.AGENTBUS.a_ha",
		"$JS.API.CONSUMER.DELETE.AGENTBUS.a_ha")
	want = append(want,
		"$KV.AGENTBUS_STATUS.*.*.a.*",
		"$JS.API.DIRECT.GET.KV_AGENTBUS_STATUS.$KV.AGENTBUS_STATUS.*.*.a.*",
		"$JS.API.CONSUMER.CREATE.KV_AGENTBUS_STATUS.*.$KV.AGENTBUS_STATUS.*.*.a.*",
		"$KV.AGENTBUS_STATUS.*.*.*.a",
		"$JS.API.DIRECT.GET.KV_AGENTBUS_STATUS.$KV.AGENTBUS_STATUS.*.*.*.a",
		"$JS.API.CONSUMER.CREATE.KV_AGENTBUS_STATUS.*.$KV.AGENTBUS_STATUS.*.*.*.a",
		"$JS.API.CONSUMER.MSG.NEXT.KV_AGENTBUS_STATUS.*",
		"$JS.API.CONSUMER.DELETE.KV_AGENTBUS_STATUS.*",
		"$KV.AGENTBUS_AGENTS.card.a",
		"$KV.AGENTBUS_AGENTS.group.*.a",
		"$KV.AGENTBUS_PRESENCE.presence.a",
		"$JS.API.DIRECT.GET.KV_AGENTBUS_AGENTS.$KV.AGENTBUS_AGENTS.>",
		"$JS.API.CONSUMER.CREATE.KV_AGENTBUS_AGENTS.*.$KV.AGENTBUS_AGENTS.>",
		"$JS.API.CONSUMER.MSG.NEXT.KV_AGENTBUS_AGENTS.*",
		"$JS.API.CONSUMER.DELETE.KV_AGENTBUS_AGENTS.*",
		"$JS.API.DIRECT.GET.KV_AGENTBUS_PRESENCE.$KV.AGENTBUS_PRESENCE.>",
		"$JS.API.CONSUMER.CREATE.KV_AGENTBUS_PRESENCE.*.$KV.AGENTBUS_PRESENCE.>",
		"$JS.API.CONSUMER.MSG.NEXT.KV_AGENTBUS_PRESENCE.*",
		"$JS.API.CONSUMER.DELETE.KV_AGENTBUS_PRESENCE.*",
		"agentbus.processes.a",
	)
	if !slices.Equal(p.Publish, want) {
		t.Errorf("Publish =\n%s\nwant\n%s", strings.Join(p.Publish, "\n"), strings.Join(want, "\n"))
	}
	if !p.Responses {
		t.Error("Responses = false, want true: an agent answers NATS micro discovery")
	}
	if want := []string{"_INBOX.a.>", "agentbus.agent.a.>", "agentbus.firing.agent.a.>", "agentbus.processes.a", "$SRV.*", "$SRV.*.agentbus", "$SRV.*.agentbus.*"}; !slices.Equal(p.Subscribe, want) {
		t.Errorf("Subscribe = %q, want %q", p.Subscribe, want)
	}
}

// TestAgentPermissionsTokens: IDs appear as their tokens (status keys as
// key tokens), and names follow the root.
func TestAgentPermissionsTokens(t *testing.T) {
	p, err := mustNew(t, "prod.bus-1").AgentPermissions("build orchestrator")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"prod.bus-1.agent.*.*.build%20orchestrator.*",
		"prod.bus-1.dlq.build%20orchestrator.*.*",
		"$JS.API.CONSUMER.CREATE.PROD_BUS-1.build%20orchestrator_b.prod.bus-1.all.>",
		"$JS.ACK.PROD_BUS-1.build%20orchestrator_p1.>",
		"$KV.PROD_BUS-1_STATUS.*.*.build=20orchestrator.*",
	} {
		if !slices.Contains(p.Publish, want) {
			t.Errorf("Publish lacks %q", want)
		}
	}
	if want := []string{"_INBOX.build%20orchestrator.>", "prod.bus-1.agent.build%20orchestrator.>", "prod.bus-1.firing.agent.build%20orchestrator.>", "prod.bus-1.processes.build%20orchestrator", "$SRV.*", "$SRV.*.agentbus", "$SRV.*.agentbus.*"}; !slices.Equal(p.Subscribe, want) {
		t.Errorf("Subscribe = %q, want %q", p.Subscribe, want)
	}
	// Every subject is a valid NATS subject: no empty token, wildcards only
	// as whole tokens.
	for _, s := range append(p.Publish, p.Subscribe...) {
		for i, tok := range strings.Split(s, ".") {
			if tok == "" || (tok != "*" && tok != ">" && strings.ContainsAny(tok, "*> \t")) {
				t.Errorf("%q: token %d %q is not valid", s, i, tok)
			}
		}
	}
}

func TestAgentPermissionsInvalidAgent(t *testing.T) {
	for _, agent := range []string{"", "*", "a\nb"} {
		if _, err := Default().AgentPermissions(agent); !errors.Is(err, ErrInvalidAgentID) {
			t.Errorf("AgentPermissions(%q) error = %v, want ErrInvalidAgentID", agent, err)
		}
		if _, err := InboxPrefix(agent); !errors.Is(err, ErrInvalidAgentID) {
			t.Errorf("InboxPrefix(%q) error = %v, want ErrInvalidAgentID", agent, err)
		}
	}
}

// TestInboxPrefix: a prefix is what nats.CustomInboxPrefix accepts (no '*'
// or '>', no trailing '.'), one token after _INBOX, distinct per agent.
func TestInboxPrefix(t *testing.T) {
	seen := map[string]string{}
	for _, agent := range append(realIDs, "a.b", "a*b", "a>b", "a.") {
		p, err := InboxPrefix(agent)
		if ValidateID(agent) != nil {
			continue
		}
		if err != nil {
			t.Fatalf("InboxPrefix(%q): %v", agent, err)
		}
		tok, ok := strings.CutPrefix(p, "_INBOX.")
		if !ok || strings.ContainsAny(tok, ".*>") || tok != EncodeToken(agent) {
			t.Errorf("InboxPrefix(%q) = %q, want _INBOX.<token>", agent, p)
		}
		if other, dup := seen[p]; dup && other != agent {
			t.Errorf("InboxPrefix(%q) = InboxPrefix(%q) = %q", agent, other, p)
		}
		seen[p] = agent
	}
}
