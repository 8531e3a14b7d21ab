package bus

import "testing"

func TestServerVersionSupport(t *testing.T) {
	tests := []struct {
		version string
		ok      bool
	}{
		{"2.15.2", true},
		{"2.11.0", true},
		{"2.11.0-RC.1", true},
		{"v2.12.3", true},
		{"3.0.0", true},
		{"2.10.22", false},
		{"2.2.0", false},
		{"1.99.99", false},
		{"garbage", false},
		{"2.11", false},
	}
	for _, tt := range tests {
		got, parsed := parseVersion(tt.version)
		if !parsed {
			if tt.ok {
				t.Errorf("parseVersion(%q) failed", tt.version)
			}
			continue
		}
		if atLeast(got, minServer) != tt.ok {
			t.Errorf("atLeast(%q, minServer) = %v, want %v", tt.version, !tt.ok, tt.ok)
		}
	}
}
