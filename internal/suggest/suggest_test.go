package suggest

import "testing"

func TestClosest(t *testing.T) {
	names := []string{"redis-url", "mysql-dsn", "listen", "http-listen", "ops-listen", "admin-key", "admin-key-file"}
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"redis-ulr", "redis-url", true}, // a transposition
		{"redisurl", "redis-url", true},  // a dash left out
		{"admin-keyfile", "admin-key-file", true},
		{"lisen", "listen", true},
		{"http-listn", "http-listen", true},
		{"verbose", "", false}, // nothing like it
		{"x", "", false},
	} {
		got, ok := Closest(tc.in, names)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("Closest(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	if d := Distance("kitten", "sitting"); d != 3 {
		t.Errorf("Distance(kitten, sitting) = %d, want 3", d)
	}
}
