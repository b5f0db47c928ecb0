/*****************************************************************************\
 *  node_features_k8s_resources.c - size each node's k8scpu/k8smemory/k8sgpu
 *  GRES from its own hardware, and keep runtime count changes from draining it.
 *
 *  Whenever a node registers (and, up to 24.11, when slurmctld starts or
 *  reconfigures), the node's totals become CPUs, RealMemory - MemSpecLimit
 *  and GPUs, minus what Kubernetes holds there according to the token the
 *  nodeledger service keeps in the node's persisted "extra" field
 *  ("nodeledger=k8scpu:C,k8smemory:M,k8sgpu:G"), so neither a restart nor a
 *  re-registration ever hands Slurm resources that pods hold.
 *  gres_node_feature() marks the GRES as set by a node_features plugin, which
 *  makes slurmctld skip its registration count check for them: counts lowered
 *  or raised at runtime never make the node INVAL, and slurm.conf needs no
 *  per-node Gres=k8s... entries.
 *
 *  In slurmctld it also watches the nodes' states: when a node is drained,
 *  resumed, set DOWN or FAIL, stops responding or registers invalid, it runs
 *  the nodeledger-job-hint hook (found among PrologSlurmctld/EpilogSlurmctld)
 *  with "--post-nodes <names>", so that nodeledger reads those nodes at once
 *  instead of at its next listing of every node (seconds at 15,000 nodes).
 *  slurmctld offers no node-state callback on every release, so a thread
 *  compares each node's state with the last seen, under the node read lock,
 *  every WATCH_MS (15,000 nodes: tens of microseconds a pass).
 *
 *  Everything else a node_features plugin may do is neutral here: no
 *  changeable features, no reboots, constraints untouched.
\*****************************************************************************/

#include <errno.h>
#include <pthread.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>

#include "src/common/bitstring.h"
#include "src/common/list.h"
#include "src/common/node_conf.h"
#include "src/common/read_config.h"
#include "src/common/run_in_daemon.h"
#include "src/common/xmalloc.h"
#include "src/common/xstring.h"
#include "src/interfaces/gres.h"
#include "src/interfaces/node_features.h"
#include "src/slurmctld/locks.h"

#include "k8s_calc.h"
#include "k8s_gres.h"
#include "k8s_slurm_compat.h"

const char plugin_name[] = "Kubernetes resources node_features plugin";
const char plugin_type[] = "node_features/k8s_resources";
const uint32_t plugin_version = SLURM_VERSION_NUMBER;

/* Reported by slurmd as its active features so that slurmctld calls
 * node_features_p_node_xlate() at every registration; never stored. */
#define REGISTRATION_MARK "k8s_resources"

static uint64_t _minus(uint64_t total, uint64_t held)
{
	return (held < total) ? total - held : 0;
}

/* Set one node's totals (slurmctld, node write lock held). */
static void _size_node(node_record_t *node_ptr)
{
	uint64_t held_cpus, held_mem, held_gpus, cpus, mem, gpus;

	k8s_extra_held(node_ptr->extra, &held_cpus, &held_mem, &held_gpus);
	gpus = k8s_gres_count(node_ptr->config_ptr ?
			      node_ptr->config_ptr->gres : node_ptr->gres,
			      "gpu");
	cpus = _minus(node_ptr->cpus, held_cpus);
	mem = _minus(node_ptr->real_memory - node_ptr->mem_spec_limit,
		     held_mem);

	if (!node_ptr->gres && node_ptr->config_ptr)
		node_ptr->gres = xstrdup(node_ptr->config_ptr->gres);
	k8s_set_total(node_ptr, "k8scpu", cpus);
	k8s_set_total(node_ptr, "k8smemory", mem);
	if (gpus)
		k8s_set_total(node_ptr, "k8sgpu", _minus(gpus, held_gpus));
	debug("%s: %s: %s: k8scpu=%"PRIu64" k8smemory=%"PRIu64" k8sgpu=%"PRIu64
	      " (Kubernetes holds %"PRIu64"/%"PRIu64"/%"PRIu64")", plugin_type,
	      __func__, node_ptr->name, cpus, mem, _minus(gpus, held_gpus),
	      held_cpus, held_mem, held_gpus);
}

/* ------------------------------------------------------------- node hints */

#define HINT_HOOK "nodeledger-job-hint"
#define WATCH_MS 200
/* More changed nodes than this in one pass: ask for a full listing ("*"). */
#define MAX_HINTED 1000

extern char **environ;

/* What a node hint reports: the states nodeledger keeps a node out for. */
typedef struct {
	uint32_t state;
	time_t reason_time;
} watched_t;

static char *hook_path = NULL;
static pthread_t watcher;
static bool watching = false;
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watch_cond = PTHREAD_COND_INITIALIZER;
static bool stopping = false;
static watched_t *seen = NULL;
static int seen_count = 0;

static watched_t _watched(node_record_t *node_ptr)
{
	uint32_t base = node_ptr->node_state & NODE_STATE_BASE;
	uint32_t flags = NODE_STATE_DRAIN | NODE_STATE_FAIL |
			 NODE_STATE_NO_RESPOND | NODE_STATE_INVALID_REG;
	watched_t w = {
		.state = (node_ptr->node_state & flags) |
			 (((base == NODE_STATE_DOWN) ||
			   (base == NODE_STATE_FUTURE) ||
			   (base == NODE_STATE_UNKNOWN)) ? base : 0),
		.reason_time = node_ptr->reason_time,
	};
	return w;
}

/* The hook among the slurmctld prologs and epilogs, by its file name. */
static char *_find_hook(char **paths, uint32_t count)
{
	for (uint32_t i = 0; i < count; i++) {
		char *base = paths[i] ? strrchr(paths[i], '/') : NULL;

		if (base && !xstrcmp(base + 1, HINT_HOOK))
			return xstrdup(paths[i]);
	}
	return NULL;
}

/*
 * The names of the nodes whose watched state changed since the last pass
 * ("*" beyond MAX_HINTED), or NULL. A node seen for the first time is only
 * remembered: nodeledger lists every node when slurmctld starts.
 */
static char *_changed_nodes(void)
{
	slurmctld_lock_t node_read = { .node = READ_LOCK };
	node_record_t *node_ptr;
	char *names = NULL;
	int changed = 0;

	lock_slurmctld(node_read);
	if (node_record_count > seen_count) {
		xrecalloc(seen, node_record_count, sizeof(watched_t));
		for (int i = seen_count; i < node_record_count; i++)
			seen[i].state = NO_VAL;
		seen_count = node_record_count;
	}
	for (int i = 0; (node_ptr = next_node(&i)); i++) {
		watched_t now = _watched(node_ptr);

		if ((seen[i].state == now.state) &&
		    (seen[i].reason_time == now.reason_time))
			continue;
		if ((seen[i].state != NO_VAL) && (++changed <= MAX_HINTED))
			xstrfmtcat(names, "%s%s", names ? "," : "",
				   node_ptr->name);
		seen[i] = now;
	}
	unlock_slurmctld(node_read);
	if (changed > MAX_HINTED) {
		xfree(names);
		names = xstrdup("*");
	}
	return names;
}

/* Run the hook and wait for it: it posts (at most two short attempts) and exits. */
static void _post(char *names)
{
	char *argv[] = { hook_path, "--post-nodes", names, NULL };
	int status = 0, rc;
	pid_t pid;

	if ((rc = posix_spawn(&pid, hook_path, NULL, NULL, argv, environ))) {
		error("%s: cannot run %s: %s", plugin_type, hook_path,
		      strerror(rc));
		return;
	}
	while ((waitpid(pid, &status, 0) < 0) && (errno == EINTR))
		;
	debug("%s: %s: nodes %s hinted", plugin_type, __func__, names);
}

static void *_watch(void *arg)
{
	struct timespec until;
	char *names;

	slurm_mutex_lock(&watch_lock);
	while (!stopping) {
		slurm_mutex_unlock(&watch_lock);
		if ((names = _changed_nodes())) {
			_post(names);
			xfree(names);
		}
		slurm_mutex_lock(&watch_lock);
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += WATCH_MS * 1000000L;
		until.tv_sec += until.tv_nsec / 1000000000L;
		until.tv_nsec %= 1000000000L;
		if (!stopping)
			pthread_cond_timedwait(&watch_cond, &watch_lock, &until);
	}
	slurm_mutex_unlock(&watch_lock);
	return NULL;
}

extern int init(void)
{
	int rc;

	if (!running_in_slurmctld())
		return SLURM_SUCCESS;
	hook_path = _find_hook(slurm_conf.prolog_slurmctld,
			       slurm_conf.prolog_slurmctld_cnt);
	if (!hook_path)
		hook_path = _find_hook(slurm_conf.epilog_slurmctld,
				       slurm_conf.epilog_slurmctld_cnt);
	if (!hook_path) {
		debug("%s: no %s among PrologSlurmctld/EpilogSlurmctld: no node hints",
		      plugin_type, HINT_HOOK);
		return SLURM_SUCCESS;
	}
	if ((rc = pthread_create(&watcher, NULL, _watch, NULL))) {
		error("%s: no node hints: thread: %s", plugin_type,
		      strerror(rc));
		xfree(hook_path);
		return SLURM_SUCCESS;
	}
	watching = true;
	info("%s: node state changes hinted through %s", plugin_type,
	     hook_path);
	return SLURM_SUCCESS;
}

extern int fini(void)
{
	if (watching) {
		slurm_mutex_lock(&watch_lock);
		stopping = true;
		slurm_cond_signal(&watch_cond);
		slurm_mutex_unlock(&watch_lock);
		pthread_join(watcher, NULL);
		watching = false;
	}
	xfree(hook_path);
	xfree(seen);
	seen_count = 0;
	return SLURM_SUCCESS;
}

/* slurmd: report the mark, so that its registration reaches node_xlate(). */
extern void node_features_p_node_state(char **avail_modes, char **current_mode)
{
	if (!*current_mode)
		*current_mode = xstrdup(REGISTRATION_MARK);
}

/*
 * slurmctld, node write lock held: every registration that reports active
 * features (ours always does) passes through here with the node's index,
 * before its GRES are validated, on every supported release. Size the node,
 * then keep its active features exactly as they were: the mark is not one.
 */
extern char *node_features_p_node_xlate(char *new_features, char *orig_features,
					char *avail_features, int node_inx)
{
	if ((node_inx >= 0) && (node_inx < node_record_count) &&
	    node_record_table_ptr[node_inx])
		_size_node(node_record_table_ptr[node_inx]);
	return xstrdup(orig_features);
}

extern char *node_features_p_node_xlate2(char *new_features)
{
	return xstrdup(new_features);
}

extern uint32_t node_features_p_boot_time(void)
{
	return 0;
}

extern bool node_features_p_changeable_feature(char *feature)
{
	return false;
}

extern int node_features_p_job_valid(char *job_features, list_t *feature_list)
{
	return SLURM_SUCCESS;
}

extern char *node_features_p_job_xlate(char *job_features,
				       list_t *feature_list,
				       bitstr_t *job_node_bitmap)
{
	return NULL;
}

extern bitstr_t *node_features_p_get_node_bitmap(void)
{
	return NULL;	/* no node is rebooted for features by this plugin */
}

extern int node_features_p_overlap(bitstr_t *active_bitmap)
{
	return 0;
}

extern int node_features_p_node_set(char *active_features, bool *need_reboot)
{
	if (need_reboot)
		*need_reboot = false;
	return SLURM_SUCCESS;
}

extern bool node_features_p_user_update(uid_t uid)
{
	return false;	/* nothing to reboot for */
}

extern void node_features_p_get_config(config_plugin_params_t *p)
{
	xstrcat(p->name, plugin_type);
}

#if K8S_NF_HAS_START_HOOK
/*
 * slurmctld start and reconfigure call this with NULL once the saved node
 * state (with "extra") is loaded: size every node now, before any slurmd
 * registers, so there is no moment with full (or no) totals. 25.11 has no
 * such call: there a node keeps its slurm.conf totals (none: zero) until it
 * registers, see the README.
 */
extern int node_features_p_get_node(char *node_list)
{
	node_record_t *node_ptr;

	if (node_list)
		return SLURM_SUCCESS;	/* a reboot: registration sizes it */
	for (int i = 0; (node_ptr = next_node(&i)); i++)
		_size_node(node_ptr);
	return SLURM_SUCCESS;
}

extern int node_features_p_node_update(char *active_features,
				       bitstr_t *node_bitmap)
{
	return SLURM_SUCCESS;	/* registration is sized in node_xlate() */
}

extern bool node_features_p_node_power(void)
{
	return false;
}

extern bool node_features_p_node_update_valid(void *node_ptr,
					      update_node_msg_t *msg)
{
	return true;
}

extern void node_features_p_step_config(bool mem_sort, bitstr_t *numa_bitmap)
{
}
#endif

#if K8S_NF_HAS_NEED_REBOOT
extern bool node_features_p_job_features_need_reboot(char *features)
{
	return false;	/* none of a job's features is ours */
}
#endif
