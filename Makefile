# telorunner — `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
MODULES := pkg services/api-edge services/pod-driver services/supervisor services/workspace-proxy services/telorunner bench
BIN := $(CURDIR)/bin
TOOLS := $(CURDIR)/.tools/bin
GOLANGCI_VERSION := v2.15.0
PORT ?= 8062
TEST_FLAGS ?= -race -count=1 -timeout 20m

.PHONY: help build run test vet fmt-check lint bench clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build every binary into ./bin
	@mkdir -p $(BIN)
	cd services/telorunner && $(GO) build -o $(BIN)/telorunner ./cmd/telorunner && $(GO) build -o $(BIN)/iotail ./cmd/iotail
	cd services/api-edge && $(GO) build -o $(BIN)/api-edge ./cmd/api-edge
	cd services/pod-driver && $(GO) build -o $(BIN)/pod-driver ./cmd/pod-driver && $(GO) build -o $(BIN)/devkernel ./cmd/devkernel
	cd services/supervisor && $(GO) build -o $(BIN)/supervisor ./cmd/supervisor
	cd services/workspace-proxy && $(GO) build -o $(BIN)/workspace-proxy ./cmd/workspace-proxy && $(GO) build -o $(BIN)/workspace-server ./cmd/workspace-server

run: build ## start the all-in-one (embedded NATS, local backend) on $PORT
	PORT=$(PORT) $(BIN)/telorunner

fmt-check: ## fail when gofmt would change a file
	@out=$$(gofmt -l $(MODULES) e2e bench 2>/dev/null); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet: ## go vet every module, in the workspace and with GOWORK=off
	@for m in $(MODULES); do echo "== vet $$m"; (cd $$m && $(GO) vet ./... && GOWORK=off $(GO) vet ./...) || exit 1; done

test: fmt-check vet ## vet + race tests of every module (GOWORK=off: each module stands alone)
	@for m in $(MODULES); do echo "== test $$m"; (cd $$m && GOWORK=off $(GO) test $(TEST_FLAGS) ./...) || exit 1; done

lint: $(TOOLS)/golangci-lint ## golangci-lint v2 (installed into .tools at a pinned version)
	@for m in $(MODULES); do echo "== lint $$m"; (cd $$m && $(TOOLS)/golangci-lint run --config $(CURDIR)/.golangci.yml ./...) || exit 1; done

$(TOOLS)/golangci-lint:
	GOBIN=$(TOOLS) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION)

bench: ## benchmarks (figures printed as ratios against in-run baselines)
	cd bench && GOWORK=off $(GO) test -count=1 -run 'TestPrint' -v -bench . -benchtime=3x ./...

clean: ## remove build output and local state
	rm -rf $(BIN) .telorunner
