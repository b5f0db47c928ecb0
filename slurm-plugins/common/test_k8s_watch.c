/*****************************************************************************\
 *  test_k8s_watch.c - table-driven tests of the node watcher's decisions.
 *  Built and run by "make check" (under valgrind with "make check VALGRIND=1").
\*****************************************************************************/

#include <stdio.h>

#include "k8s_watch.h"

#define MAX 1000
#define BEAT 60000

typedef struct {
	const char *name;
	int changed;
	bool lost;
	int64_t idle_ms;
	k8s_hint_t want;
} hint_case_t;

static const hint_case_t cases[] = {
	{ "quiet pass", 0, false, 200, K8S_HINT_NONE },
	{ "quiet for a heartbeat: alive", 0, false, BEAT, K8S_HINT_ALIVE },
	{ "one node changed", 1, false, 200, K8S_HINT_NODES },
	{ "changed, heartbeat due too: names say alive", 2, false, BEAT,
	  K8S_HINT_NODES },
	{ "as many as named", MAX, false, 0, K8S_HINT_NODES },
	{ "more than named: every node", MAX + 1, false, 0, K8S_HINT_ALL },
	{ "after a failed post, a change: every node", 1, true, 200,
	  K8S_HINT_ALL },
	{ "after a failed post, quiet: wait for the heartbeat", 0, true, 200,
	  K8S_HINT_NONE },
	{ "after a failed post, heartbeat due: every node", 0, true, BEAT,
	  K8S_HINT_ALL },
};

static int failures = 0, checked = 0;

static void check_i64(const char *name, int64_t got, int64_t want)
{
	checked++;
	if (got != want) {
		printf("FAIL %s: got %lld, want %lld\n", name, (long long) got,
		       (long long) want);
		failures++;
	}
}

int main(void)
{
	struct timespec t = { .tv_sec = 10, .tv_nsec = 900000000L };
	struct timespec later;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const hint_case_t *c = &cases[i];

		check_i64(c->name, k8s_hint_kind(c->changed, MAX, c->lost,
						 c->idle_ms, BEAT), c->want);
	}

	later = k8s_ts_add_ms(t, 200);
	check_i64("add carries a second", later.tv_sec, 11);
	check_i64("add keeps the rest", later.tv_nsec, 100000000L);
	check_i64("between", k8s_ts_ms_between(t, later), 200);
	check_i64("between backwards", k8s_ts_ms_between(later, t), -200);
	later = k8s_ts_add_ms(t, 10000);
	check_i64("add whole seconds", k8s_ts_ms_between(t, later), 10000);
	later = k8s_ts_add_ms(t, -950);
	check_i64("add negative borrows", later.tv_sec, 9);
	check_i64("add negative rest", later.tv_nsec, 950000000L);

	printf("%s: %d watch cases, %d failures\n", failures ? "FAIL" : "ok",
	       checked, failures);
	return failures ? 1 : 0;
}
