package engine

import (
	"reflect"
	"testing"

	"github.com/tokenshard/tokenshard/internal/decision"
)

// TestDecisionFields holds Decision and the shards' form of it together:
// every field of decision.Decision is a field of Decision of the same name
// and type (a decision.Name is a string there), and set copies each one
// (each is made non-zero in turn, and must arrive, alone) over a Decision
// whose every field was set before, so any field of Decision that
// decision.Decision lacks must come out zero.
func TestDecisionFields(t *testing.T) {
	wt, dt := reflect.TypeFor[decision.Decision](), reflect.TypeFor[Decision]()
	nameType := reflect.TypeFor[decision.Name]()
	for i := range wt.NumField() {
		wf := wt.Field(i)
		df, ok := dt.FieldByName(wf.Name)
		if !ok || (df.Type != wf.Type && (wf.Type != nameType || df.Type.Kind() != reflect.String)) {
			t.Errorf("decision.Decision.%s (%v) is not a field of engine.Decision of that type", wf.Name, wf.Type)
			continue
		}
		var w decision.Decision
		v := reflect.ValueOf(&w).Elem().Field(i)
		arrives := v
		switch {
		case wf.Type == nameType:
			v.Set(reflect.ValueOf(decision.NameOf("band")))
			arrives = reflect.ValueOf("band")
		case v.Kind() == reflect.Bool:
			v.SetBool(true)
		case v.Kind() == reflect.Int64:
			v.SetInt(int64(i) + 7)
		default:
			t.Fatalf("decision.Decision.%s: a field of kind %v: teach this test to set it", wf.Name, v.Kind())
		}
		var want Decision
		d := stale(t)
		d.set(&w)
		reflect.ValueOf(&want).Elem().FieldByName(wf.Name).Set(arrives)
		if d != want {
			t.Errorf("set copied decision.Decision{%s: %v} as %+v, want %+v", wf.Name, v, d, want)
		}
	}
}

// stale returns a Decision with every field non-zero, as a reused result
// would have: a field set leaves alone shows up in the comparison.
func stale(t *testing.T) Decision {
	var d Decision
	v := reflect.ValueOf(&d).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int64:
			f.SetInt(-1)
		case reflect.String:
			f.SetString("stale")
		default:
			t.Fatalf("Decision.%s: a field of kind %v: teach this test to set it", v.Type().Field(i).Name, f.Kind())
		}
	}
	return d
}
