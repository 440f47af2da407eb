package contract

import "fmt"

// Ports the runner itself listens on inside a session's network namespace
// (contract 11.4).
const (
	WorkspacePort    = 8099 // the watch pod's workspace server
	FirstInspectPort = 9230 // the inspector of app i listens on FirstInspectPort+i
)

// ReservedPorts maps each port an app may not declare in a session of mode
// with apps apps to what uses it: a watch session's workspace server and
// its apps' inspect ports, or a run session's inspect port when inspect is
// on. (The co-resident agent's port follows the manifest-wins rule
// instead, 4.4.2 step 9.)
func ReservedPorts(mode string, inspect bool, apps int) map[int]string {
	out := map[int]string{}
	switch {
	case mode == ModeWatch:
		out[WorkspacePort] = "the workspace server"
		for i := range max(apps, 1) {
			out[FirstInspectPort+i] = fmt.Sprintf("an inspect port (app %d)", i)
		}
	case inspect:
		out[FirstInspectPort] = "the inspect port"
	}
	return out
}
