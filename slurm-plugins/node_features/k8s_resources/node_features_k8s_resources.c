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
 *  Everything else a node_features plugin may do is neutral here: no
 *  changeable features, no reboots, constraints untouched.
\*****************************************************************************/

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>

#include "src/common/bitstring.h"
#include "src/common/list.h"
#include "src/common/node_conf.h"
#include "src/common/read_config.h"
#include "src/common/xmalloc.h"
#include "src/common/xstring.h"
#include "src/interfaces/gres.h"
#include "src/interfaces/node_features.h"

#include "k8s_calc.h"
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

static gres_node_state_t *_gres_ns(node_record_t *node_ptr, char *name,
				   gres_state_t **gres_state_node)
{
	uint32_t plugin_id = gres_build_id(name);

	if (!node_ptr->gres_list ||
	    !(*gres_state_node = list_find_first(node_ptr->gres_list,
						 gres_find_id, &plugin_id)))
		return NULL;
	return (*gres_state_node)->gres_data;
}

/*
 * Move slurmctld's cluster-wide count of one GRES by "delta" (uint64_t
 * arithmetic wraps, so it may be negative). gres_node_feature() never touches
 * that count while every runtime "update node gres=" moves it by "new - old":
 * left alone it drifts, and when it lands on NO_VAL64 slurmctld rejects every
 * job that asks for the GRES ("Invalid Trackable RESource (TRES)
 * specification"). Slurm's own reconfiguration is the only writer of the
 * count, and it adds "new - old": hand it the node's state alone with "old"
 * chosen to make up the difference.
 */
static void _move_cluster_count(node_record_t *node_ptr, char *name,
				gres_state_t *gres_state_node, uint64_t delta)
{
	gres_node_state_t *gres_ns = gres_state_node->gres_data;
	uint64_t keep = gres_ns->gres_cnt_config;
	char *entry, *unused = NULL;
	list_t *one;

	if (!delta)
		return;
	gres_ns->gres_cnt_config = keep - delta;
	entry = xstrdup_printf("%s:%"PRIu64, name, keep);
	one = list_create(NULL);	/* borrows the node's state */
	list_append(one, gres_state_node);
	gres_node_reconfig(node_ptr->name, entry, &unused, &one,
			   slurm_conf.conf_flags & CONF_FLAG_OR,
			   node_ptr->cores, node_ptr->tot_sockets);
	FREE_NULL_LIST(one);
	gres_ns->gres_cnt_config = keep;	/* if not taken: not in GresTypes */
	xfree(unused);
	xfree(entry);
}

/*
 * Set one GRES total and move the cluster-wide count with it.
 * gres_node_feature() marks the GRES so that registration never checks its
 * count, but leaves "total - allocated" available (made for KNL memory
 * modes), which would count running jobs twice; a runtime
 * "scontrol update node gres=" sets the total itself, and so do we.
 */
static void _set_total(node_record_t *node_ptr, char *name, uint64_t total)
{
	gres_state_t *gres_state_node;
	gres_node_state_t *gres_ns;
	uint64_t old = 0;

	if ((gres_ns = _gres_ns(node_ptr, name, &gres_state_node)))
		old = gres_ns->gres_cnt_config;
	gres_node_feature(node_ptr->name, name, total, &node_ptr->gres,
			  &node_ptr->gres_list);
	if (!(gres_ns = _gres_ns(node_ptr, name, &gres_state_node)))
		return;		/* not in GresTypes */
	gres_ns->gres_cnt_avail = total;
	_move_cluster_count(node_ptr, name, gres_state_node, total - old);
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
	_set_total(node_ptr, "k8scpu", cpus);
	_set_total(node_ptr, "k8smemory", mem);
	if (gpus)
		_set_total(node_ptr, "k8sgpu", _minus(gpus, held_gpus));
	debug("%s: %s: %s: k8scpu=%"PRIu64" k8smemory=%"PRIu64" k8sgpu=%"PRIu64
	      " (Kubernetes holds %"PRIu64"/%"PRIu64"/%"PRIu64")", plugin_type,
	      __func__, node_ptr->name, cpus, mem, _minus(gpus, held_gpus),
	      held_cpus, held_mem, held_gpus);
}

extern int init(void)
{
	return SLURM_SUCCESS;
}

extern int fini(void)
{
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
