package decision

import "testing"

func TestName(t *testing.T) {
	if NameOf("") != (Name{}) || (Name{}).String() != "" {
		t.Error(`"" is not the zero Name`)
	}
	b := []byte("daily")
	if a, c := NameOf("daily"), NameOf(string(b)); a != c || a.String() != "daily" || a == NameOf("hourly") {
		t.Errorf("NameOf(%q) = %v, NameOf of an equal string %v: want equal, and unequal to another", "daily", a, c)
	}
}
