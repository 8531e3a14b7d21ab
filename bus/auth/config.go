package auth

import (
	"fmt"
	"strings"
)

// ServerConfig renders the accounts of s in nats-server configuration
// syntax:
//
//	accounts {
//	  AGENTBUS { jetstream: enabled, users: [ admin, one user per agent ] }
//	  SYS { users: [ sys ] }
//	}
//	system_account: SYS
//
// The file stands alone (`agentbus serve --auth FILE`, nats-server
// --config) and is a fragment an existing server config includes
// (include "auth.conf"). Without the system account (Config.NoSystemAccount)
// neither SYS nor system_account is written. It holds public keys and
// password hashes, no secret.
func (s *Setup) ServerConfig() []byte {
	c := s.Config
	var b strings.Builder
	fmt.Fprintf(&b, `# nats-server accounts of the agentbus bus under root %q, written by
# "agentbus auth init" (mode %s). Regenerate it rather than edit it.
#
# Run it:      agentbus serve --auth auth.conf, with the admin's credentials
# Or include:  include "auth.conf" in an existing server config
# (docs/security.md, "Deploying into an existing cluster").
`, c.Root, c.Mode)
	b.WriteString("\naccounts {\n")
	fmt.Fprintf(&b, "  %s {\n    jetstream: enabled\n    users: [\n", c.Account)
	for _, id := range s.Identities {
		if id.Account == c.Account {
			writeUser(&b, id)
		}
	}
	b.WriteString("    ]\n  }\n")
	if !c.NoSystemAccount {
		fmt.Fprintf(&b, "  %s {\n    users: [\n", SystemAccount)
		for _, id := range s.Identities {
			if id.Account == SystemAccount {
				writeUser(&b, id)
			}
		}
		b.WriteString("    ]\n  }\n")
	}
	b.WriteString("}\n")
	if !c.NoSystemAccount {
		fmt.Fprintf(&b, "\nsystem_account: %s\n", SystemAccount)
	}
	return []byte(b.String())
}

// roleComments say what each kind of user is for.
var roleComments = map[Role]string{
	RoleAdmin:  "the whole account, for provisioning, dead letters and operator tools",
	RoleSystem: "server monitoring and events",
	RoleAgent:  "its own subjects, consumers, dead letters, status records and inbox",
}

// writeUser writes one entry of a users list.
func writeUser(b *strings.Builder, id Identity) {
	const in = "      "
	fmt.Fprintf(b, "%s# %s: %s\n%s{\n", in, id, roleComments[id.Role], in)
	if id.PublicKey != "" {
		fmt.Fprintf(b, "%s  nkey: %s\n", in, quote(id.PublicKey))
	} else {
		fmt.Fprintf(b, "%s  user: %s\n%s  password: %s\n", in, quote(id.User), in, quote(id.passwordHash))
	}
	if p := id.Permissions; len(p.Publish)+len(p.Subscribe) > 0 {
		fmt.Fprintf(b, "%s  permissions: {\n", in)
		writeList(b, in+"    ", "publish", p.Publish)
		writeList(b, in+"    ", "subscribe", p.Subscribe)
		if p.Responses {
			fmt.Fprintf(b, "%s    allow_responses: true\n", in)
		}
		fmt.Fprintf(b, "%s  }\n", in)
	}
	fmt.Fprintf(b, "%s}\n", in)
}

// writeList writes key: "one" or key: [ ... ], one subject a line.
func writeList(b *strings.Builder, in, key string, subjects []string) {
	if len(subjects) == 1 {
		fmt.Fprintf(b, "%s%s: %s\n", in, key, quote(subjects[0]))
		return
	}
	fmt.Fprintf(b, "%s%s: [\n", in, key)
	for _, s := range subjects {
		fmt.Fprintf(b, "%s  %s\n", in, quote(s))
	}
	fmt.Fprintf(b, "%s]\n", in)
}

// quote writes s as a double-quoted config string. Subjects, keys and
// hashes hold neither '"' nor '\'; they are escaped all the same.
func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
