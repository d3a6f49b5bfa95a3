package decision

import (
	"fmt"
	"testing"
)

func TestName(t *testing.T) {
	if NameOf("") != (Name{}) || (Name{}).String() != "" {
		t.Error(`"" is not the zero Name`)
	}
	s := "daily"
	if n := NameAt(&s); n.String() != "daily" || n == (Name{}) {
		t.Errorf("NameAt(%q).String() = %q", s, n.String())
	}
	if got := fmt.Sprintf("%#v", NameOf("daily")); got != `decision.NameOf("daily")` {
		t.Errorf("%%#v of a Name = %s", got)
	}
}
