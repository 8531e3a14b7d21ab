// Package cli implements the agentbus command line, built with cobra: serve,
// provision, publish, subscribe, request, reply, status, trace, history,
// redeliver, dlq (list, show, replay, purge, watch), bench, demo and auth
// (init).
//
// [Main] runs one command line in-process with the streams it is given, so
// tests call it directly against an embedded server instead of building the
// binary. It is the only place in agentbus that prints: the library packages
// report errors and never write to stdout or stderr.
//
// The output of every command is a contract that scripts rely on:
//
//   - serve prints its client URL alone on the first line of stdout;
//   - provision prints one line "stream <NAME> key=value ...";
//   - publish, reply, redeliver and dlq replay print "id=<ID> seq=<N>", with
//     " duplicate" appended when the server already had the ID;
//   - subscribe prints one line per message; with --json one CloudEvents
//     JSON document per line and nothing else on stdout; with --exec
//     nothing of its own;
//   - request prints its reply as subscribe prints a message, on one line,
//     and exits 1 naming the request when no reply comes in time;
//   - status prints one line per lifecycle record, or with --json a JSON
//     array; trace prints a header line "conversation <C> trace_id=<T>" and
//     a table, or with --json one JSON document; both exit 1 when there is
//     no record;
//   - history prints one line per message, or with --json one JSON object
//     per line, then "next=<cursor>" ({"next":"<cursor>"}) when more
//     follow, and exits 1 when the conversation has no message;
//   - dlq list prints one line per dead letter (--json: one JSON object per
//     line), dlq show one JSON document, dlq purge "purged <N>";
//   - auth init prints the files it wrote and how to use them;
//   - bench prints a table, or with --json one JSON document;
//   - demo prints a timeline, or with --json one JSON object per event and
//     a last line with event "summary", and exits 0 only if every scene
//     showed what it is meant to;
//   - a failure exits non-zero (2 for usage errors, 1 otherwise) with one
//     line "agentbus: <error>" on stderr; warnings that do not stop a
//     command start "agentbus: warning: ".
package cli
