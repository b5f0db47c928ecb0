/*****************************************************************************\
 *  k8s_watch.h - what the node_features plugin's node watcher posts, and its
 *  clock arithmetic.
 *
 *  Pure functions (no slurmctld, no clock reads): the plugin passes what it
 *  saw and the times it read from CLOCK_MONOTONIC. Covered by
 *  test_k8s_watch.c.
\*****************************************************************************/

#ifndef _K8S_WATCH_H
#define _K8S_WATCH_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

typedef enum {
	K8S_HINT_NONE,	/* nothing to post this pass */
	K8S_HINT_NODES,	/* the changed nodes, by name */
	K8S_HINT_ALL,	/* "*": the service lists every node */
	K8S_HINT_ALIVE,	/* no node: "the watcher runs" (a heartbeat) */
} k8s_hint_t;

/*
 * What to post after a pass that saw "changed" nodes change state.
 * "lost": a post failed since the last one that succeeded, so the service
 * may have missed changes whose names are gone: only "*" repairs that.
 * "idle_ms": since the last post was tried; "heartbeat_ms": how often the
 * service hears from the watcher when nothing changes (a failed post is
 * tried again at that rate, not at every pass).
 */
extern k8s_hint_t k8s_hint_kind(int changed, int max_named, bool lost,
				int64_t idle_ms, int64_t heartbeat_ms);

/* "t" plus "ms" milliseconds, normalized. */
extern struct timespec k8s_ts_add_ms(struct timespec t, int64_t ms);

/* Milliseconds from "from" to "to" (negative when "to" is earlier). */
extern int64_t k8s_ts_ms_between(struct timespec from, struct timespec to);

#endif /* _K8S_WATCH_H */
