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
 *  every WATCH_MS (15,000 nodes: tens of microseconds a pass). The hook runs
 *  with none of slurmctld's descriptors, for at most HOOK_MS; with nothing
 *  to report it still runs every HEARTBEAT_MS, so that the service notices
 *  when hints stop.
 *
 *  Everything else a node_features plugin may do is neutral here: no
 *  changeable features, no reboots, constraints untouched.
\*****************************************************************************/

/* posix_spawn_file_actions_addclosefrom_np() (glibc 2.34) */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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
#include "src/slurmctld/slurmctld.h"

#include "k8s_calc.h"
#include "k8s_gres.h"
#include "k8s_slurm_compat.h"
#include "k8s_watch.h"

/*
 * slurmctld's own, absent from slurmd, which loads this plugin too: weak, so
 * that the plugin loads there (only the watcher reads it, in slurmctld).
 */
#pragma weak slurmctld_config

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
/*
 * With nothing changed, the watcher still runs the hook this often with no
 * node ("alive"), so that the service can tell a watcher that stopped (or
 * hints that fail) from a quiet cluster.
 */
#define HEARTBEAT_MS 60000
/*
 * The longest one run of the hook may take (its two attempts at the default
 * timeout=2 fit): then its process group is killed, so that a service that
 * never answers delays the next hint by at most this.
 */
#define HOOK_MS 10000
/* How often the wait for the hook looks whether it has exited. */
#define REAP_MS 10

extern char **environ;

/* What a node hint reports: the states nodeledger keeps a node out for. */
typedef struct {
	uint32_t state;
	time_t reason_time;
} watched_t;

static char *hook_path = NULL;
static pthread_t watcher = 0;
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watch_cond;	/* on CLOCK_MONOTONIC, from init() */
static bool stopping = false;		/* fini(): under watch_lock */
/* The watcher thread's own. */
static watched_t *seen = NULL;
static int seen_count = 0;
static bool lost = false;		/* a post failed since the last success */
static struct timespec last_try;	/* CLOCK_MONOTONIC */

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

static bool _shutting_down(void)
{
	return &slurmctld_config && slurmctld_config.shutdown_time;
}

/*
 * How many nodes' watched state changed since the last pass, their names in
 * *names (the first MAX_HINTED); -1 once slurmctld shuts down. A node seen
 * for the first time is only remembered: nodeledger lists every node when
 * slurmctld starts.
 * Shutdown: slurmctld frees the node tables before it unloads plugins (and a
 * production build never unloads them), so no fini() comes early enough to
 * stop this thread; instead it never reads them once shutdown_time is set,
 * which happens before they are freed. Looked at before locking too: a lock
 * held while slurmctld checks that none is left makes it skip saving state.
 */
static int _changed_nodes(char **names)
{
	slurmctld_lock_t node_read = { .node = READ_LOCK };
	node_record_t *node_ptr;
	int changed = 0;

	if (_shutting_down())
		return -1;
	lock_slurmctld(node_read);
	if (_shutting_down()) {
		unlock_slurmctld(node_read);
		return -1;
	}
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
			xstrfmtcat(*names, "%s%s", *names ? "," : "",
				   node_ptr->name);
		seen[i] = now;
	}
	unlock_slurmctld(node_read);
	return changed;
}

/*
 * Start the hook in its own process group, with stdin/stdout/stderr on
 * /dev/null and no other descriptor of slurmctld's (its listening sockets
 * lose CLOEXEC at reconfigure: a hook outliving slurmctld would keep its
 * port), default signal handling and nothing blocked. -1 if it cannot run.
 */
static pid_t _spawn(char *names)
{
	char *argv[] = { hook_path, "--post-nodes", names, NULL };
	int reset[] = { SIGPIPE, SIGHUP, SIGINT, SIGTERM, SIGQUIT, SIGCHLD,
			SIGALRM, SIGUSR1, SIGUSR2, SIGTSTP, SIGXCPU };
	posix_spawn_file_actions_t files;
	posix_spawnattr_t attr;
	sigset_t none, dfl;
	pid_t pid = -1;
	int rc;

	sigemptyset(&none);
	sigemptyset(&dfl);
	for (size_t i = 0; i < sizeof(reset) / sizeof(reset[0]); i++)
		sigaddset(&dfl, reset[i]);
	posix_spawn_file_actions_init(&files);
	posix_spawn_file_actions_addopen(&files, STDIN_FILENO, "/dev/null",
					 O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, "/dev/null",
					 O_WRONLY, 0);
	posix_spawn_file_actions_adddup2(&files, STDOUT_FILENO, STDERR_FILENO);
	posix_spawn_file_actions_addclosefrom_np(&files, STDERR_FILENO + 1);
	posix_spawnattr_init(&attr);
	posix_spawnattr_setpgroup(&attr, 0);
	posix_spawnattr_setsigmask(&attr, &none);
	posix_spawnattr_setsigdefault(&attr, &dfl);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP |
				 POSIX_SPAWN_SETSIGMASK |
				 POSIX_SPAWN_SETSIGDEF);
	if ((rc = posix_spawn(&pid, hook_path, &files, &attr, argv, environ))) {
		error("%s: cannot run %s: %s", plugin_type, hook_path,
		      strerror(rc));
		pid = -1;
	}
	posix_spawnattr_destroy(&attr);
	posix_spawn_file_actions_destroy(&files);
	return pid;
}

/*
 * Wait for the hook at most HOOK_MS (less once fini() stops the watcher),
 * then kill its process group, its curl included. True when it exited 0:
 * the hint was posted (or the hook is not configured to post).
 */
static bool _reap(pid_t pid)
{
	struct timespec start, now, tick;
	bool late = false, stop = false;
	int status = 0;
	pid_t done;

	clock_gettime(CLOCK_MONOTONIC, &start);
	slurm_mutex_lock(&watch_lock);
	while (!(done = waitpid(pid, &status, WNOHANG)) ||
	       ((done < 0) && (errno == EINTR))) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		stop = stopping;
		if (stop || (k8s_ts_ms_between(start, now) >= HOOK_MS)) {
			late = true;
			break;
		}
		tick = k8s_ts_add_ms(now, REAP_MS);
		pthread_cond_timedwait(&watch_cond, &watch_lock, &tick);
	}
	slurm_mutex_unlock(&watch_lock);
	if (late) {
		if (stop)
			info("%s: slurmctld stops: %s killed", plugin_type,
			     hook_path);
		else
			error("%s: %s ran longer than %d ms: killed",
			      plugin_type, hook_path, HOOK_MS);
		killpg(pid, SIGKILL);
		while ((waitpid(pid, &status, 0) < 0) && (errno == EINTR))
			;
		return false;
	}
	if (done < 0) {
		error("%s: waitpid(%d): %m", plugin_type, (int) pid);
		return false;
	}
	return WIFEXITED(status) && !WEXITSTATUS(status);
}

/*
 * Post what this pass calls for (k8s_hint_kind()): the changed nodes, "*"
 * (many changed, or a post failed before: names the service never got are
 * gone), or no node at all at the heartbeat.
 */
static void _hint(int changed, char *names)
{
	char *what = NULL;
	struct timespec now;
	pid_t pid;
	bool posted;

	clock_gettime(CLOCK_MONOTONIC, &now);
	switch (k8s_hint_kind(changed, MAX_HINTED, lost,
			      k8s_ts_ms_between(last_try, now), HEARTBEAT_MS)) {
	case K8S_HINT_NONE:
		return;
	case K8S_HINT_NODES:
		what = names;
		break;
	case K8S_HINT_ALL:
		what = "*";
		break;
	case K8S_HINT_ALIVE:
		what = "";
		break;
	}
	last_try = now;
	posted = ((pid = _spawn(what)) > 0) && _reap(pid);
	if (!posted && !lost)
		error("%s: node hint \"%s\" not posted: the next one will ask for every node",
		      plugin_type, what);
	else if (posted && lost)
		info("%s: node hints posted again (\"%s\")", plugin_type, what);
	else if (posted)
		debug("%s: %s: nodes \"%s\" hinted", plugin_type, __func__,
		      what);
	lost = !posted;
}

static bool _stopping(void)
{
	bool stop;

	slurm_mutex_lock(&watch_lock);
	stop = stopping;
	slurm_mutex_unlock(&watch_lock);
	return stop;
}

/* Sleep WATCH_MS, or until fini() says stop. */
static void _pause(void)
{
	struct timespec until;

	slurm_mutex_lock(&watch_lock);
	clock_gettime(CLOCK_MONOTONIC, &until);
	until = k8s_ts_add_ms(until, WATCH_MS);
	if (!stopping)
		pthread_cond_timedwait(&watch_cond, &watch_lock, &until);
	slurm_mutex_unlock(&watch_lock);
}

static void *_watch(void *arg)
{
	char *names = NULL;
	int changed;

	clock_gettime(CLOCK_MONOTONIC, &last_try);
	while (!_stopping()) {
		if ((changed = _changed_nodes(&names)) < 0)
			break;	/* slurmctld shuts down */
		_hint(changed, names);
		xfree(names);
		_pause();
	}
	debug("%s: node watcher stopped", plugin_type);
	return NULL;
}

extern int init(void)
{
	pthread_condattr_t attr;

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
	/* Waits measured on the monotonic clock: a step of the wall clock
	 * neither stops hints nor cuts a hook's time short. */
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&watch_cond, &attr);
	pthread_condattr_destroy(&attr);
	stopping = false;
	K8S_THREAD_CREATE("k8s_hints", &watcher, _watch, NULL);
	info("%s: node state changes hinted through %s", plugin_type,
	     hook_path);
	return SLURM_SUCCESS;
}

/*
 * Only MEMORY_LEAK_DEBUG builds of slurmctld call this, after the node
 * tables are freed: by then the watcher has stopped reading them (see
 * _changed_nodes()); stop it, kill a hook it waits for, and join it.
 */
extern int fini(void)
{
	if (watcher) {
		slurm_mutex_lock(&watch_lock);
		stopping = true;
		slurm_cond_broadcast(&watch_cond);
		slurm_mutex_unlock(&watch_lock);
		slurm_thread_join(watcher);
		pthread_cond_destroy(&watch_cond);
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
