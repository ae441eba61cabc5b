#!/usr/bin/env bash
# Runs Jaeger all-in-one (v1.76, in-memory storage) on 127.0.0.1 only, for
# looking at effectline's traces and for the optional real-Jaeger trace test.
#
#   scripts/jaeger.sh          build if needed, run in the foreground (Ctrl-C stops)
#   scripts/jaeger.sh start    build if needed, run in the background, wait until healthy
#   scripts/jaeger.sh stop     stop the background instance
#   scripts/jaeger.sh build    only build the binary
#   scripts/jaeger.sh env      print the exports that point effectline at it:
#                              eval "$(scripts/jaeger.sh env)"
#
# Jaeger is built from tools/jaeger, a Go module of its own, so that its
# hundreds of dependencies never enter effectline's go.mod. A cold build takes
# about ten minutes on a 2-core machine; later runs reuse the binary.
#
# Environment:
#   JAEGER_BIN              binary path (default bin/jaeger-v1.76.0 in the repository)
#   JAEGER_OTLP_HTTP_PORT   4318     JAEGER_OTLP_GRPC_PORT   4317
#   JAEGER_UI_PORT          16686    JAEGER_QUERY_GRPC_PORT  16685
#   JAEGER_HEALTH_PORT      13133
#   JAEGER_STATE_DIR        pid and log files of "start" (default ${TMPDIR:-/tmp}/effectline-jaeger)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tooldir="$root/tools/jaeger"
config="$tooldir/config.yaml"
bin=${JAEGER_BIN:-$root/bin/jaeger-v1.76.0}
state=${JAEGER_STATE_DIR:-${TMPDIR:-/tmp}/effectline-jaeger}
pidfile="$state/jaeger.pid"
logfile="$state/jaeger.log"

export JAEGER_OTLP_HTTP_PORT=${JAEGER_OTLP_HTTP_PORT:-4318}
export JAEGER_OTLP_GRPC_PORT=${JAEGER_OTLP_GRPC_PORT:-4317}
export JAEGER_UI_PORT=${JAEGER_UI_PORT:-16686}
export JAEGER_QUERY_GRPC_PORT=${JAEGER_QUERY_GRPC_PORT:-16685}
export JAEGER_HEALTH_PORT=${JAEGER_HEALTH_PORT:-13133}

otlp_endpoint="http://127.0.0.1:$JAEGER_OTLP_HTTP_PORT"
ui_url="http://127.0.0.1:$JAEGER_UI_PORT"
health_url="http://127.0.0.1:$JAEGER_HEALTH_PORT/status"

log() { printf 'jaeger.sh: %s\n' "$*" >&2; }

build() {
	# Rebuild when tools/jaeger/go.mod changed (a version bump) since the
	# binary was built.
	if [[ -x "$bin" && ! "$tooldir/go.mod" -nt "$bin" ]]; then
		return
	fi
	log "building Jaeger into $bin (a cold build takes ~10 minutes)"
	mkdir -p "$(dirname "$bin")"
	local start=$SECONDS
	# nice: the machine is shared; GOWORK=off: never let a go.work pull the
	# tool module in with the product.
	(cd "$tooldir" && GOWORK=off nice -n 19 go build -o "$bin" github.com/jaegertracing/jaeger/cmd/jaeger)
	log "built in $((SECONDS - start))s"
}

# print_env prints shell exports: eval "$(scripts/jaeger.sh env)".
print_env() {
	cat <<EOF
export OTEL_EXPORTER_OTLP_ENDPOINT=$otlp_endpoint
export JAEGER_UI_URL=$ui_url
EOF
}

running_pid() {
	[[ -f "$pidfile" ]] || return 1
	local pid
	pid=$(<"$pidfile")
	# Check that the pid is still our Jaeger, not a recycled pid.
	if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null &&
		tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$config"; then
		echo "$pid"
		return 0
	fi
	return 1
}

wait_healthy() {
	local pid=$1 deadline=$((SECONDS + 60))
	while ((SECONDS < deadline)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			log "Jaeger exited during start; last lines of $logfile:"
			tail -n 30 "$logfile" >&2
			return 1
		fi
		if curl -fsS -o /dev/null "$health_url" 2>/dev/null; then
			return 0
		fi
		sleep 0.5
	done
	log "Jaeger not healthy after 60s; see $logfile"
	return 1
}

banner() {
	log "OTLP/HTTP endpoint: $otlp_endpoint   (export OTEL_EXPORTER_OTLP_ENDPOINT=$otlp_endpoint)"
	log "OTLP/gRPC endpoint: 127.0.0.1:$JAEGER_OTLP_GRPC_PORT"
	log "UI:                 $ui_url"
	log "API:                $ui_url/api/traces?service=effectline"
}

case "${1:-run}" in
build)
	build
	;;
env)
	print_env
	;;
run)
	build
	banner
	exec "$bin" --config "$config"
	;;
start)
	if pid=$(running_pid); then
		log "already running (pid $pid)"
		banner
		print_env
		exit 0
	fi
	build
	mkdir -p "$state"
	# setsid: its own process group, so stopping it never touches ours.
	setsid "$bin" --config "$config" >"$logfile" 2>&1 </dev/null &
	pid=$!
	echo "$pid" >"$pidfile"
	if ! wait_healthy "$pid"; then
		kill "$pid" 2>/dev/null || true
		rm -f "$pidfile"
		exit 1
	fi
	log "started (pid $pid, log $logfile)"
	banner
	print_env
	;;
stop)
	if pid=$(running_pid); then
		kill "$pid"
		for _ in $(seq 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		log "stopped (pid $pid)"
	else
		log "not running"
	fi
	rm -f "$pidfile"
	;;
*)
	sed -n '2,22p' "$0" >&2
	exit 2
	;;
esac
