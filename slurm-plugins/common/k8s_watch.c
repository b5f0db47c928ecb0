/*****************************************************************************\
 *  k8s_watch.c - what the node watcher posts, and its clock arithmetic.
\*****************************************************************************/

#include "k8s_watch.h"

#define NS_PER_MS 1000000L
#define NS_PER_S 1000000000L

extern k8s_hint_t k8s_hint_kind(int changed, int max_named, bool lost,
				int64_t idle_ms, int64_t heartbeat_ms)
{
	bool due = idle_ms >= heartbeat_ms;

	if (lost)
		return (changed || due) ? K8S_HINT_ALL : K8S_HINT_NONE;
	if (changed > max_named)
		return K8S_HINT_ALL;
	if (changed)
		return K8S_HINT_NODES;
	return due ? K8S_HINT_ALIVE : K8S_HINT_NONE;
}

extern struct timespec k8s_ts_add_ms(struct timespec t, int64_t ms)
{
	t.tv_sec += ms / 1000;
	t.tv_nsec += (ms % 1000) * NS_PER_MS;
	if (t.tv_nsec >= NS_PER_S) {
		t.tv_sec++;
		t.tv_nsec -= NS_PER_S;
	} else if (t.tv_nsec < 0) {
		t.tv_sec--;
		t.tv_nsec += NS_PER_S;
	}
	return t;
}

extern int64_t k8s_ts_ms_between(struct timespec from, struct timespec to)
{
	return ((int64_t) (to.tv_sec - from.tv_sec)) * 1000 +
	       (to.tv_nsec - from.tv_nsec) / NS_PER_MS;
}
