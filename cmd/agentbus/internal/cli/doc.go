// Package cli implements the agentbus command line: serve, provision,
// publish and subscribe, built with cobra.
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
//   - publish prints "id=<ID> seq=<N>", with " duplicate" appended when the
//     server already had the ID;
//   - subscribe --json prints one CloudEvents JSON document per line and
//     nothing else on stdout;
//   - a failure exits non-zero (2 for usage errors, 1 otherwise) with one
//     line "agentbus: <error>" on stderr; warnings that do not stop a
//     command start "agentbus: warning: ".
package cli
