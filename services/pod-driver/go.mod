module github.com/telorunner/telorunner/services/pod-driver

go 1.26.0

require github.com/telorunner/telorunner/pkg v0.0.0

require (
	github.com/creack/pty v1.1.24 // indirect
	github.com/goccy/go-yaml v1.19.2 // indirect
	github.com/gorilla/websocket v1.5.3 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

replace github.com/telorunner/telorunner/pkg => ../../pkg
