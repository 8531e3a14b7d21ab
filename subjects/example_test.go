package subjects_test

import (
	"errors"
	"fmt"

	"github.com/agentbus/agentbus/subjects"
)

func ExampleEncodeToken() {
	for _, id := range []string{"orchestrator", "build orchestrator", "@agent-cto", "a.b", "日本語"} {
		fmt.Println(subjects.EncodeToken(id))
	}
	// Output:
	// orchestrator
	// build%20orchestrator
	// %40agent-cto
	// a%2Eb
	// %E6%97%A5%E6%9C%AC%E8%AA%9E
}

func ExampleDecodeToken() {
	id, err := subjects.DecodeToken("build%20orchestrator")
	fmt.Printf("%q %v\n", id, err)

	// Only the canonical spelling is accepted: "A" is never escaped.
	_, err = subjects.DecodeToken("%41")
	fmt.Println(errors.Is(err, subjects.ErrInvalidToken))
	// Output:
	// "build orchestrator" <nil>
	// true
}

func ExampleScheme_Direct() {
	s := subjects.Default()
	subj, err := s.Direct("reviewer", "build orchestrator", "review_request", subjects.HighestPriority)
	fmt.Println(subj, err)

	_, err = s.Direct(subjects.Broadcast, "build orchestrator", "review_request", 1)
	fmt.Println(errors.Is(err, subjects.ErrInvalidAgentID))
	// Output:
	// agentbus.agent.reviewer.p1.build%20orchestrator.review_request <nil>
	// true
}

func ExampleScheme_Broadcast() {
	s, err := subjects.New("prod.bus-1")
	if err != nil {
		panic(err)
	}
	subj, err := s.Broadcast("orchestrator", "shutdown", subjects.DefaultPriority)
	fmt.Println(subj, err)
	// Output:
	// prod.bus-1.all.p3.orchestrator.shutdown <nil>
}

func ExampleScheme_Parse() {
	s := subjects.Default()
	a, err := s.Parse("agentbus.agent.reviewer.p2.%40agent-cto.TASK_ASSIGNMENT")
	if err != nil {
		panic(err)
	}
	fmt.Printf("%v to=%q from=%q type=%q priority=%d\n", a.Kind, a.To, a.From, a.Type, a.Priority)

	_, err = s.Parse("agentbus.agent.reviewer.p9.x.y")
	fmt.Println(errors.Is(err, subjects.ErrInvalidSubject), errors.Is(err, subjects.ErrInvalidPriority))
	// Output:
	// direct to="reviewer" from="@agent-cto" type="TASK_ASSIGNMENT" priority=2
	// true true
}

func ExampleScheme_Consumers() {
	s := subjects.Default()
	fmt.Println(s.Stream(), s.StreamSubjects()[0], "...")
	cs, err := s.Consumers("build orchestrator")
	if err != nil {
		panic(err)
	}
	for _, c := range cs {
		fmt.Println(c.Priority, c.Broadcast, c.Name, c.Filter)
	}
	// Output:
	// AGENTBUS agentbus.agent.*.p1.*.* ...
	// 1 false build%20orchestrator_p1 agentbus.agent.build%20orchestrator.p1.>
	// 2 false build%20orchestrator_p2 agentbus.agent.build%20orchestrator.p2.>
	// 3 false build%20orchestrator_p3 agentbus.agent.build%20orchestrator.p3.>
	// 4 false build%20orchestrator_p4 agentbus.agent.build%20orchestrator.p4.>
	// 5 false build%20orchestrator_p5 agentbus.agent.build%20orchestrator.p5.>
	// 0 true build%20orchestrator_b agentbus.all.>
}

func ExampleScheme_ParseConsumer() {
	c, err := subjects.Default().ParseConsumer("build%20orchestrator_p3")
	fmt.Printf("%q %d %v %v\n", c.Agent, c.Priority, c.Broadcast, err)
	c, err = subjects.Default().ParseConsumer("build%20orchestrator_b")
	fmt.Printf("%q %d %v %v\n", c.Agent, c.Priority, c.Broadcast, err)
	// Output:
	// "build orchestrator" 3 false <nil>
	// "build orchestrator" 0 true <nil>
}

func ExampleScheme_IndexedDirect() {
	s := subjects.Default()
	subj, _ := s.IndexedDirect("reviewer", "lead", "review_request", 2, "m-17", "release-42")
	fmt.Println(subj)

	// A status lookup finds the message by its ID in the stream's subject
	// index; Parse returns the index.
	fmt.Println(s.MessageFilters("m-17"))
	a, _ := s.Parse(subj)
	fmt.Println(a.Index.ID, a.Index.Conversation == subjects.ConversationKey("release-42"))
	fmt.Println(s.WithoutIndex(subj))

	// The bus's own IDs, UUIDs version 7, are named by the 4 ms window of
	// their time, which the messages made in it share; a lookup keeps the
	// one with the ID from the window's.
	id := "019ab1c2-d3e4-7abc-8def-0123456789ab"
	subj, _ = s.IndexedDirect("reviewer", "lead", "review_request", 2, id, id)
	fmt.Println(subj)
	fmt.Println(s.MessageFilters(id)[0])
	// Output:
	// agentbus.agent.reviewer.p2.lead.review_request.m-17.717e81e2c69e106ad7cb5c8c712e0921
	// [agentbus.agent.*.*.*.*.m-17.*]
	// m-17 true
	// agentbus.agent.reviewer.p2.lead.review_request
	// agentbus.agent.reviewer.p2.lead.review_request.=T66ac70b4f9.=T66ac70b4f9
	// agentbus.agent.*.*.*.*.=T66ac70b4f9.*
}
