package engine

import (
	"reflect"
	"testing"

	"github.com/tokenshard/tokenshard/internal/decision"
)

// TestDecisionFields holds Decision and the shards' form of it together:
// every field of decision.Decision is a field of Decision of the same name
// and type, and set copies each one (each is made non-zero in turn, and
// must arrive, alone). Decision may have more fields, which set leaves as
// they were.
func TestDecisionFields(t *testing.T) {
	wt, dt := reflect.TypeFor[decision.Decision](), reflect.TypeFor[Decision]()
	for i := range wt.NumField() {
		wf := wt.Field(i)
		df, ok := dt.FieldByName(wf.Name)
		if !ok || df.Type != wf.Type {
			t.Errorf("decision.Decision.%s (%v) is not a field of engine.Decision of that type", wf.Name, wf.Type)
			continue
		}
		var w decision.Decision
		v := reflect.ValueOf(&w).Elem().Field(i)
		switch v.Kind() {
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Int64:
			v.SetInt(int64(i) + 7)
		case reflect.String:
			v.SetString("band")
		default:
			t.Fatalf("decision.Decision.%s: a field of kind %v: teach this test to set it", wf.Name, v.Kind())
		}
		var d, want Decision
		d.set(&w)
		reflect.ValueOf(&want).Elem().FieldByName(wf.Name).Set(v)
		if d != want {
			t.Errorf("set copied decision.Decision{%s: %v} as %+v, want %+v", wf.Name, v, d, want)
		}
	}
}
