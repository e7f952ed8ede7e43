// Command warren-fninit is the pid 1 of FnCall containers; the node agent
// starts it. See internal/fncall/fninit.
package main

import (
	"os"

	"github.com/warrenhq/warren/internal/fncall/fninit"
)

func main() { os.Exit(fninit.Main()) }
