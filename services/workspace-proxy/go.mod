module github.com/telorunner/telorunner/services/workspace-proxy

go 1.26.0

require github.com/telorunner/telorunner/pkg v0.0.0

replace github.com/telorunner/telorunner/pkg => ../../pkg
