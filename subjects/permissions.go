package subjects

// An agent's server permissions follow from the scheme: the subjects it
// sends on, its six consumers, its dead letters, the status records naming
// it and its reply inbox. This file spells out the NATS and JetStream API
// subjects those take; docs/security.md explains each.
// MicroService is the NATS micro service name a registered agent answers
// discovery as (nats micro ls agentbus); its metadata names the agent.
const MicroService = "agentbus"

const (
	microPrefix = "$SRV."  // NATS micro discovery: $SRV.<verb>[.<name>[.<id>]]
	inboxRoot   = "_INBOX" // nats.go's reply inbox root

	jsAPI            = "$JS.API."
	jsConsumerCreate = jsAPI + "CONSUMER.CREATE." // <stream>.<name>.<filter>
	jsConsumerInfo   = jsAPI + "CONSUMER.INFO."   // <stream>.<name>
	jsConsumerNext   = jsAPI + "CONSUMER.MSG.NEXT."
	jsConsumerDelete = jsAPI + "CONSUMER.DELETE."
	jsDirectGet      = jsAPI + "DIRECT.GET." // <stream>.<subject>
	jsAck            = "$JS.ACK."            // <stream>.<consumer>.<5 tokens>
	kvPrefix         = "$KV."                // <bucket>.<key>
	kvStreamPrefix   = "KV_"                 // a bucket's stream
	anyToken         = "*"
)

// Permissions are the subjects one NATS user may publish and subscribe to,
// as they go into a server's authorization: everything else is denied.
// Wildcards have their NATS meaning.
type Permissions struct {
	// Publish lists the subjects the user may publish to, JetStream API
	// requests and acknowledgements included.
	Publish []string
	// Subscribe lists the subjects the user may subscribe to.
	Subscribe []string
	// Responses lets the user answer the requests it receives, once each,
	// on their reply subjects (nats-server's allow_responses), whatever
	// Publish says.
	Responses bool
}

// InboxPrefix returns the reply inbox prefix of agent, "_INBOX.<token>".
// An agent's connection uses it in place of nats.go's random "_INBOX"
// prefix (nats.CustomInboxPrefix), so that its permissions can allow the
// replies to its own requests, and only those. The token has no '*', '>'
// or '.', as nats.go requires of a prefix. An inbox prefix has no root: an
// agent ID names one principal in every bus (root) of an account. The
// error wraps [ErrInvalidAgentID].
func InboxPrefix(agent string) (string, error) {
	if err := ValidateID(agent); err != nil {
		return "", err
	}
	return inboxRoot + "." + EncodeToken(agent), nil
}

// AgentPermissions returns what agent needs for its work on the bus of s,
// and nothing more. With R the root, t the agent's token, S the stream, B
// the status bucket and P each of the agent's two [StatusKeyPatterns], it
// may publish to:
//
//   - R.agent.*.*.t.*, R.agent.*.*.t.*.*.* (indexed) and R.all.*.t.*:
//     messages that name it as the sender;
//   - R.dlq.t.*.*: the dead letters it files (see [Scheme.DeadLetter]);
//   - for each of its consumers C with filter F ([Scheme.Consumers]):
//     $JS.API.CONSUMER.CREATE.S.C.F, create or update C with filter F and
//     no other (the server refuses a request whose configured filter is not
//     the one in the subject); $JS.API.CONSUMER.MSG.NEXT.S.C, pull;
//     $JS.ACK.S.C.>, acknowledge;
//   - $JS.API.CONSUMER.CREATE.S.t_h.R.agent.t.>, then
//     $JS.API.CONSUMER.MSG.NEXT.S.t_h and $JS.API.CONSUMER.DELETE.S.t_h:
//     the short-lived consumer that reads its own past messages
//     ([Scheme.HistoryConsumer]);
//   - $JS.API.DIRECT.GET.S.R.agent.t.> and $JS.API.DIRECT.GET.S.R.agent.*.*.t.>:
//     read the last message of a subject, or filter, that names it as the
//     recipient or the sender: a status lookup finds a message by its
//     indexed subject ([Scheme.MessageFiltersOfAgent]);
//   - $JS.API.CONSUMER.CREATE.S.t_hs.R.agent.*.*.t.> and
//     $JS.API.CONSUMER.CREATE.S.t_ha.R.all.>, each with MSG.NEXT and DELETE:
//     the short-lived consumers that read again the direct messages it sent
//     and the broadcasts, for its part of a conversation's history
//     ([Scheme.SentHistoryConsumer], [Scheme.BroadcastHistoryConsumer]);
//   - $JS.API.CONSUMER.INFO.S.*: read the state of any agent's consumer on
//     the stream (no message in it): how far a recipient has got is how a
//     status lookup tells delivered and completed, which nobody writes,
//     and the backlog metrics read the agent's own;
//   - $KV.B.P: write the status records that name it;
//   - $JS.API.DIRECT.GET.KV_B.$KV.B.P: read one of them by key;
//   - $JS.API.CONSUMER.CREATE.KV_B.*.$KV.B.P, then
//     $JS.API.CONSUMER.MSG.NEXT.KV_B.* and $JS.API.CONSUMER.DELETE.KV_B.*:
//     the short-lived consumers that look records up by message ID
//     (described "agentbus read", random names, each deleted once read);
//   - with A the registry bucket ([Scheme.RegistryBucket]) and P the
//     presence bucket ([Scheme.PresenceBucket]): $KV.A.card.k and
//     $KV.P.presence.k, k the agent's key token: its own card and
//     presence, and no other agent's; $KV.A.group.*.k: its own membership
//     of any group ([GroupKey]), to join and leave;
//   - for each of A and P, $JS.API.DIRECT.GET.KV_A.$KV.A.>,
//     $JS.API.CONSUMER.CREATE.KV_A.*.$KV.A.>, $JS.API.CONSUMER.MSG.NEXT.KV_A.*
//     and $JS.API.CONSUMER.DELETE.KV_A.*: read every agent's card and
//     presence, which the registry is for;
//   - R.processes.t: ask whether another process of the agent is running
//     ([Scheme.ProcessesSubject]) before reporting the agent offline.
//
// No stream information: it would list every key of the bucket.
//
// It may subscribe to its reply inbox, [InboxPrefix] followed by ".>", to
// R.agent.t.>, where Request listens for replies while it waits and a
// subscriber hears that a priority's consumer is due, to R.firing.agent.t.>,
// the firing notices of the messages scheduled to it
// ([Scheme.FiringFilter]), to R.processes.t, which its registered processes
// answer ([Scheme.ProcessesSubject]), and to the NATS micro discovery subjects of the service [MicroService]
// ($SRV.<verb>, $SRV.<verb>.agentbus and $SRV.<verb>.agentbus.<id>), which
// it answers once registered, as it may answer any request it receives
// (Responses).
//
// The error wraps [ErrInvalidAgentID].
func (s Scheme) AgentPermissions(agent string) (Permissions, error) {
	cs, err := s.Consumers(agent)
	if err != nil {
		return Permissions{}, err
	}
	patterns, err := StatusKeyPatterns(agent)
	if err != nil {
		return Permissions{}, err
	}
	inbox, err := InboxPrefix(agent)
	if err != nil {
		return Permissions{}, err
	}
	root, tok, stream := s.Root(), EncodeToken(agent), s.Stream()
	pub := []string{
		root + "." + kindAgent + "." + anyToken + "." + anyToken + "." + tok + "." + anyToken,
		root + "." + kindAgent + "." + anyToken + "." + anyToken + "." + tok + "." + anyToken + "." + anyToken + "." + anyToken,
		root + "." + kindAll + "." + anyToken + "." + tok + "." + anyToken,
		root + "." + kindDLQ + "." + tok + "." + anyToken + "." + anyToken,
	}
	for _, c := range cs {
		pub = append(pub,
			jsConsumerCreate+stream+"."+c.Name+"."+c.Filter,
			jsConsumerNext+stream+"."+c.Name,
			jsAck+stream+"."+c.Name+"."+tail,
		)
	}
	history := tok + historySep
	pub = append(pub,
		jsConsumerCreate+stream+"."+history+"."+root+"."+kindAgent+"."+tok+"."+tail,
		jsConsumerNext+stream+"."+history,
		jsConsumerDelete+stream+"."+history,
		jsConsumerInfo+stream+"."+anyToken,
		s.StreamDirectGetPrefix()+root+"."+kindAgent+"."+tok+"."+tail,
		s.StreamDirectGetPrefix()+root+"."+kindAgent+"."+anyToken+"."+anyToken+"."+tok+"."+tail)
	sent, sentFilter, _ := s.SentHistoryConsumer(agent) // agent is valid
	all, allFilter, _ := s.BroadcastHistoryConsumer(agent)
	for _, c := range [][2]string{{sent, sentFilter}, {all, allFilter}} {
		pub = append(pub, jsConsumerCreate+stream+"."+c[0]+"."+c[1], jsConsumerNext+stream+"."+c[0], jsConsumerDelete+stream+"."+c[0])
	}
	bucket := s.StatusBucket()
	kvStream, kv := kvStreamPrefix+bucket, kvPrefix+bucket+"."
	for _, p := range patterns {
		pub = append(pub,
			kv+p,
			jsDirectGet+kvStream+"."+kv+p,
			jsConsumerCreate+kvStream+"."+anyToken+"."+kv+p,
		)
	}
	pub = append(pub,
		jsConsumerNext+kvStream+"."+anyToken,
		jsConsumerDelete+kvStream+"."+anyToken,
	)
	ktok := keyToken(agent)
	regKV, presenceKV := s.RegistrySubjectPrefix(), s.PresenceSubjectPrefix()
	pub = append(pub,
		regKV+cardKeyPrefix+ktok,
		regKV+groupKeyPrefix+anyToken+"."+ktok,
		presenceKV+presenceKeyPrefix+ktok,
	)
	for _, bucket := range []string{s.RegistryBucket(), s.PresenceBucket()} {
		stream := kvStreamPrefix + bucket
		pub = append(pub,
			kvDirectGetPrefix(bucket)+tail,
			jsConsumerCreate+stream+"."+anyToken+"."+kvSubjectPrefix(bucket)+tail,
			jsConsumerNext+stream+"."+anyToken,
			jsConsumerDelete+stream+"."+anyToken,
		)
	}
	pub = append(pub, root+"."+kindProcesses+"."+tok)
	return Permissions{
		Publish: pub,
		Subscribe: []string{inbox + "." + tail, root + "." + kindAgent + "." + tok + "." + tail,
			root + "." + kindFiring + "." + kindAgent + "." + tok + "." + tail,
			root + "." + kindProcesses + "." + tok,
			microPrefix + anyToken, microPrefix + anyToken + "." + MicroService, microPrefix + anyToken + "." + MicroService + "." + anyToken},
		Responses: true,
	}, nil
}
