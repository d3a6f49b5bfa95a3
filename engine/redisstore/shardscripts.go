package redisstore

import (
	_ "embed"
	"strings"
)

// adminLib holds the administrative scripts, each in its own section: see
// its header.
//
//go:embed admin.lua
var adminLib string

// adminScript is the script of admin.lua's section name, after the file's
// prelude.
func adminScript(name string) string {
	prelude, rest, _ := strings.Cut(adminLib, "\n-- script: ")
	for _, sec := range strings.Split(rest, "\n-- script: ") {
		if n, body, _ := strings.Cut(sec, "\n"); n == name {
			return prelude + "\n" + body
		}
	}
	panic("redisstore: admin.lua has no script " + name)
}

var (
	installSrc      = adminScript("install")
	shardInstallSrc = adminScript("shardInstall")
	intentSrc       = adminScript("intent")
	prepareSrc      = adminScript("prepare")
	commitSrc       = adminScript("commit")
	publishSrc      = adminScript("publish")
	flagSrc         = adminScript("flag")
	doneSrc         = adminScript("done")
	pendingSrc      = adminScript("pending")
	refreshSrc      = adminScript("refresh")
	releaseSrc      = adminScript("release")
)
