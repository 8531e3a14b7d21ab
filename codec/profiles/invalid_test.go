package profiles_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentbus/agentbus/codec/profiles"
)

const (
	bmHead = `"messageId":"m1","correlationId":"c1","timestamp":"2024-01-01T12:00:00Z","from":"a","to":"b","version":"1.0"`
	coHead = `"from":"a","to":"b","timestamp":"2026-02-05T10:30:00Z"`
	piHead = `"id":"p1","from":"pm","to":"dev","timestamp":"2026-04-11T01:10:00Z"`
)

// TestValidateInvalid breaks one rule per case: required fields, enums,
// each hard rule and each length limit. wantErr false cases are the valid
// neighbours of the rules, so a rule that fires too eagerly fails too.
func TestValidateInvalid(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	tests := []struct {
		name    string
		profile string
		native  string
		wantErr bool
		want    [][2]string // field, rule: each must be among the findings
	}{
		// basemessage
		{"bm valid status", "basemessage", `{` + bmHead + `,"type":"STATUS_UPDATE","payload":{"taskId":"T","status":"BLOCKED","progress":50}}`, false, nil},
		{"bm missing messageId", "basemessage", `{"correlationId":"c1","timestamp":"2024-01-01T12:00:00Z","from":"a","to":"b","version":"1.0","type":"STATUS_UPDATE","payload":{"taskId":"T","status":"STARTED"}}`, true, [][2]string{{"/messageId", "required"}}},
		{"bm unknown type", "basemessage", `{` + bmHead + `,"type":"HELLO","payload":{}}`, true, [][2]string{{"/type", "enum"}}},
		{"bm bad status enum", "basemessage", `{` + bmHead + `,"type":"STATUS_UPDATE","payload":{"taskId":"T","status":"DONE"}}`, true, [][2]string{{"/payload/status", "enum"}}},
		{"bm progress over 100", "basemessage", `{` + bmHead + `,"type":"STATUS_UPDATE","payload":{"taskId":"T","status":"PROGRESS","progress":101}}`, true, [][2]string{{"/payload/progress", "maximum"}}},
		{"bm bad severity", "basemessage", `{` + bmHead + `,"type":"ERROR_REPORT","payload":{"severity":"FATAL","count":1,"errors":[]}}`, true, [][2]string{{"/payload/severity", "enum"}}},
		{"bm bad decision", "basemessage", `{` + bmHead + `,"type":"VALIDATION_RESPONSE","payload":{"taskId":"T","decision":"MAYBE","reasons":[]}}`, true, [][2]string{{"/payload/decision", "enum"}}},
		{"bm bad timestamp", "basemessage", `{"messageId":"m1","correlationId":"c1","timestamp":"yesterday","from":"a","to":"b","version":"1.0","type":"DOC_QUERY","payload":{"queryType":"SEARCH","topic":"t","keywords":[]}}`, true, [][2]string{{"/timestamp", "format"}}},
		{"bm version 2", "basemessage", `{"messageId":"m1","correlationId":"c1","timestamp":"2024-01-01T12:00:00Z","from":"a","to":"b","version":"2.0","type":"DOC_QUERY","payload":{"queryType":"SEARCH","topic":"t","keywords":[]}}`, true, [][2]string{{"/version", "pattern"}}},
		{"bm missing payload field", "basemessage", `{` + bmHead + `,"type":"MESSAGE_ERROR","payload":{"originalMessageId":"x","errorType":"INVALID_FORMAT"}}`, true, [][2]string{{"/payload/details", "required"}}},
		{"bm not json", "basemessage", `{"messageId":`, true, [][2]string{{"", "syntax"}}},

		// coordination
		{"co valid blocked", "coordination", `{"type":"status_update",` + coHead + `,"content":{"taskId":"t","status":"blocked","blockedBy":"waiting for schema"}}`, false, nil},
		{"co missing content", "coordination", `{"type":"question",` + coHead + `}`, true, [][2]string{{"/content", "required"}}},
		{"co bad type", "coordination", `{"type":"chat",` + coHead + `,"content":{}}`, true, [][2]string{{"/type", "enum"}}},
		{"co bad status", "coordination", `{"type":"status_update",` + coHead + `,"content":{"taskId":"t","status":"done"}}`, true, [][2]string{{"/content/status", "enum"}}},
		{"co blocked without blockedBy", "coordination", `{"type":"status_update",` + coHead + `,"content":{"taskId":"t","status":"blocked"}}`, true, [][2]string{{"/content/blockedBy", "status=blocked requires blockedBy"}}},
		{"co blocked with null blockedBy", "coordination", `{"type":"status_update",` + coHead + `,"content":{"taskId":"t","status":"blocked","blockedBy":null}}`, true, [][2]string{{"/content/blockedBy", "status=blocked requires blockedBy"}}},
		{"co result blocked without blockedBy", "coordination", `{"type":"result",` + coHead + `,"content":{"status":"blocked","summary":"s","nextSteps":[]}}`, true, [][2]string{{"/content/blockedBy", "status=blocked requires blockedBy, nextSteps"}}},
		{"co result failed without error", "coordination", `{"type":"result",` + coHead + `,"content":{"status":"failed","summary":"s","nextSteps":[]}}`, true, [][2]string{{"/content/error", "status=failed requires error, nextSteps"}}},
		{"co result complete without files", "coordination", `{"type":"result",` + coHead + `,"content":{"status":"complete","summary":"s","nextSteps":[]}}`, true, [][2]string{{"/content/filesModified", "status=complete requires filesModified, filesRead, nextSteps"}}},
		{"co objective 200", "coordination", `{"type":"task_assignment",` + coHead + `,"content":{"taskId":"t","agentName":"w","objective":"` + long(200) + `"}}`, false, nil},
		{"co objective 201", "coordination", `{"type":"task_assignment",` + coHead + `,"content":{"taskId":"t","agentName":"w","objective":"` + long(201) + `"}}`, true, [][2]string{{"/content/objective", "maxLength"}}},
		{"co summary 301", "coordination", `{"type":"result",` + coHead + `,"content":{"status":"failed","summary":"` + long(301) + `","error":"e","nextSteps":[]}}`, true, [][2]string{{"/content/summary", "maxLength"}}},
		{"co progress 201", "coordination", `{"type":"status_update",` + coHead + `,"content":{"taskId":"t","status":"in_progress","progress":"` + long(201) + `"}}`, true, [][2]string{{"/content/progress", "maxLength"}}},
		{"co question 300", "coordination", `{"type":"question",` + coHead + `,"content":{"taskId":"t","question":"` + long(300) + `"}}`, false, nil},
		{"co question 301", "coordination", `{"type":"question",` + coHead + `,"content":{"taskId":"t","question":"` + long(301) + `"}}`, true, [][2]string{{"/content/question", "maxLength"}}},
		{"co objective counts characters", "coordination", `{"type":"task_assignment",` + coHead + `,"content":{"taskId":"t","agentName":"w","objective":"` + strings.Repeat("é", 200) + `"}}`, false, nil},

		// pipeline
		{"pi valid no priority", "pipeline", `{` + piHead + `,"subject":"stop","body":{"reason":"r"}}`, false, nil},
		{"pi missing body", "pipeline", `{` + piHead + `,"subject":"stop"}`, true, [][2]string{{"/body", "required"}}},
		{"pi unknown subject", "pipeline", `{` + piHead + `,"subject":"hello","body":{}}`, true, [][2]string{{"/subject", "enum"}}},
		{"pi priority 0", "pipeline", `{` + piHead + `,"subject":"stop","body":{"reason":"r"},"priority":0}`, true, [][2]string{{"/priority", "minimum"}}},
		{"pi priority 6", "pipeline", `{` + piHead + `,"subject":"stop","body":{"reason":"r"},"priority":6}`, true, [][2]string{{"/priority", "maximum"}}},
		{"pi bad status", "pipeline", `{` + piHead + `,"subject":"stop","body":{"reason":"r"},"status":"lost"}`, true, [][2]string{{"/status", "enum"}}},
		{"pi needs_human body", "pipeline", `{` + piHead + `,"subject":"needs_human","body":{"reason":"r"}}`, true, [][2]string{{"/body/type", "required"}}},
		{"pi review_changes issues not array", "pipeline", `{` + piHead + `,"subject":"review_changes","body":{"prUrl":"u","issues":"x","comments":"c","severity":"s"}}`, true, [][2]string{{"/body/issues", "type"}}},

		// swarm
		{"sw revision without feedback", "swarm", `{"$schema":"component-assignment","component_id":"C1","component_name":"n","component_spec":"s","files_to_create":[],"files_to_modify":[],"dependencies_completed":[],"testing_strategy":"t","attempt":2,"revision":true}`, true, [][2]string{{"/previous_feedback", "revision=true requires previous_feedback"}}},
		{"sw fix_tests without failures", "swarm", `{"$schema":"component-assignment","component_id":"C1","component_name":"n","component_spec":"s","files_to_create":[],"files_to_modify":[],"dependencies_completed":[],"testing_strategy":"t","attempt":2,"fix_tests":true}`, true, [][2]string{{"/failures", "fix_tests=true requires failures"}}},
		{"sw bad verdict", "swarm", `{"schema":"ReviewResult","component_id":"C1","verdict":"maybe","issues":[],"notes":null,"turn_count":3}`, true, [][2]string{{"/verdict", "enum"}}},
		{"sw bad issue severity", "swarm", `{"schema":"ReviewResult","component_id":"C1","verdict":"rejected","issues":[{"severity":"urgent","file":"f","line":null,"description":"d","suggested_fix":"s"}],"notes":null,"turn_count":3}`, true, [][2]string{{"/issues/0/severity", "enum"}}},
		{"sw missing turn_count", "swarm", `{"schema":"TestHandoff","component_id":"C1","test_files":[],"test_count":1,"coverage":"c","run_command":"go test"}`, true, [][2]string{{"/turn_count", "required"}}},
		{"sw unknown schema", "swarm", `{"schema":"Gossip"}`, true, [][2]string{{"/schema", "enum"}}},
		{"sw finding prefix", "swarm", `{"schema":"ReviewFindings","reviewer":"security","timestamp":"2026-01-01T00:00:00Z","summary":{"total_findings":1,"by_severity":{"critical":0,"high":1,"medium":0,"low":0,"informational":0},"verdict":"findings"},"findings":[{"id":"QA-001","severity":"high","category":"auth","file":"f","line":3,"description":"d","evidence":"e","suggested_fix":"s","risk":"r"}]}`, true, [][2]string{{"/findings/0/id", "finding id prefix matches reviewer"}}},
		{"sw regression flag", "swarm", `{"schema":"VerificationResult","lint":"pass","lint_issues":[],"tests_run":3,"tests_passed":2,"tests_failed":1,"failures":[],"status":"fail","baseline_comparison":{"baseline_passed":3,"baseline_failed":0,"net_new_failures":1,"regression":false}}`, true, [][2]string{{"/baseline_comparison/regression", "regression=true iff net_new_failures>0"}}},
		{"sw no regression", "swarm", `{"schema":"VerificationResult","lint":"pass","lint_issues":[],"tests_run":3,"tests_passed":3,"tests_failed":0,"failures":[],"status":"pass","baseline_comparison":{"baseline_passed":3,"baseline_failed":0,"net_new_failures":0,"regression":false}}`, false, nil},

		// frontmatter
		{"fm no envelope", "frontmatter", "# just markdown\n", true, [][2]string{{"", "frontmatter"}}},
		{"fm unclosed envelope", "frontmatter", "---\ntype: approval\nsignal: lgtm\n", true, [][2]string{{"", "frontmatter"}}},
		{"fm bad yaml", "frontmatter", "---\ntype: [approval\n---\n", true, [][2]string{{"", "syntax"}}},
		{"fm missing signal", "frontmatter", "---\ntype: approval\n---\n", true, [][2]string{{"/signal", "required"}}},
		{"fm unknown type", "frontmatter", "---\ntype: memo\nsignal: lgtm\n---\n", true, [][2]string{{"/type", "enum"}}},
		{"fm signal of other direction", "frontmatter", "---\ntype: approval\nsignal: pass\n---\n", true, [][2]string{{"/signal", "enum"}}},
		{"fm signal case", "frontmatter", "---\ntype: review_verdict\nsignal: PASS\ncritical_count: 0\nmoderate_count: 0\nminor_count: 0\nac_coverage: {}\n---\n", true, [][2]string{{"/signal", "enum"}}},
		{"fm worker missing qa_check", "frontmatter", "---\ntype: worker_submission\nsignal: rfr\nfiles_changed: []\n---\n", true, [][2]string{{"/qa_check", "required"}}},
		{"fm review missing minor_count", "frontmatter", "---\ntype: review_verdict\nsignal: pass\ncritical_count: 0\nmoderate_count: 0\nac_coverage: {}\n---\n", true, [][2]string{{"/minor_count", "required"}}},
		{"fm critical requires fail", "frontmatter", "---\ntype: review_verdict\nsignal: pass_with_notes\ncritical_count: 1\nmoderate_count: 0\nminor_count: 0\nac_coverage: {}\n---\n", true, [][2]string{{"/signal", "critical_count>0 requires signal=fail"}}},
		{"fm critical with fail", "frontmatter", "---\ntype: review_verdict\nsignal: fail\ncritical_count: 1\nmoderate_count: 0\nminor_count: 0\nac_coverage: {AC1: fail}\n---\n", false, nil},
		{"fm audit critical requires fail", "frontmatter", "---\ntype: audit_verdict\nsignal: pass\nsecurity_findings: {critical: 2, high: 0, medium: 0, low: 0}\nbuild_status: pass\ntest_status: pass\n---\n", true, [][2]string{{"/signal", "security_findings.critical>0 requires signal=fail"}}},
		{"fm audit build fail requires fail", "frontmatter", "---\ntype: audit_verdict\nsignal: pass_with_notes\nsecurity_findings: {critical: 0, high: 0, medium: 0, low: 0}\nbuild_status: fail\ntest_status: skipped\n---\n", true, [][2]string{{"/signal", "build_status=fail requires signal=fail"}}},
		{"fm audit test fail requires fail", "frontmatter", "---\ntype: audit_verdict\nsignal: pass\nsecurity_findings: {critical: 0, high: 0, medium: 0, low: 0}\nbuild_status: pass\ntest_status: fail\n---\n", true, [][2]string{{"/signal", "test_status=fail requires signal=fail"}}},
		{"fm audit bad build_status", "frontmatter", "---\ntype: audit_verdict\nsignal: fail\nsecurity_findings: {critical: 0, high: 0, medium: 0, low: 0}\nbuild_status: broken\ntest_status: fail\n---\n", true, [][2]string{{"/build_status", "enum"}}},
		{"fm research_needed requires count", "frontmatter", "---\ntype: triage_result\nsignal: triage_complete\ntier: 2\nresearch_needed: true\n---\n", true, [][2]string{{"/research_count", "research_needed=true requires research_count"}}},
		{"fm tier 4", "frontmatter", "---\ntype: triage_result\nsignal: triage_complete\ntier: 4\nresearch_needed: false\n---\n", true, [][2]string{{"/tier", "enum"}}},
		{"fm plan missing has_blockers", "frontmatter", "---\ntype: plan_result\nsignal: plan_complete\nplan_file: p.md\nwave_count: 1\nrisk_tags: []\n---\n", true, [][2]string{{"/has_blockers", "required"}}},
		{"fm bad fix_severity", "frontmatter", "---\ntype: revision_request\nsignal: revise\niteration: 4\nfix_severity: some\n---\n", true, [][2]string{{"/fix_severity", "enum"}}},
		{"fm research_request missing topic", "frontmatter", "---\ntype: research_request\nsignal: research\n---\n", true, [][2]string{{"/topic", "required"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, ok := profiles.Lookup(tt.profile)
			if !ok {
				t.Fatalf("Lookup(%q) failed", tt.profile)
			}
			err := p.Validate([]byte(tt.native))
			if (err != nil) != tt.wantErr {
				t.Fatalf("Validate = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil {
				return
			}
			if !errors.Is(err, profiles.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			ve, ok := errors.AsType[*profiles.ValidationError](err)
			if !ok {
				t.Fatalf("error %T is not a *ValidationError", err)
			}
			if ve.Profile != tt.profile {
				t.Errorf("Profile = %q, want %q", ve.Profile, tt.profile)
			}
			for _, fr := range tt.want {
				if !ve.Has(fr[0], fr[1]) {
					t.Errorf("findings %v lack field %q rule %q", ve.Findings, fr[0], fr[1])
				}
			}
		})
	}
}
