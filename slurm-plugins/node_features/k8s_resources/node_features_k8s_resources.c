/*****************************************************************************\
 *  node_features_k8s_resources.c - size each node's k8scpu/k8smemory/k8sgpu
 *  GRES from its own hardware, and keep runtime count changes from draining it.
 *
 *  When a node registers, its totals become CPUs, RealMemory - MemSpecLimit and
 *  GPUs, minus what Kubernetes holds there according to the token the
 *  nodeledger service keeps in the node's persisted "extra" field
 *  ("nodeledger=k8scpu:C,k8smemory:M,k8sgpu:G"), so a re-registration never
 *  hands Slurm resources that pods hold. gres_node_feature() marks the GRES as
 *  set by a node_features plugin, which makes slurmctld skip its registration
 *  count check for them: counts lowered or raised at runtime never make the
 *  node INVAL, and slurm.conf needs no per-node Gres=k8s... entries.
 *
 *  Everything else a node_features plugin may do is neutral here: no
 *  changeable features, no reboots, constraints untouched.
\*****************************************************************************/

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>

#include "src/common/bitstring.h"
#include "src/common/list.h"
#include "src/common/node_conf.h"
#include "src/common/xmalloc.h"
#include "src/common/xstring.h"
#include "src/interfaces/gres.h"
#include "src/interfaces/node_features.h"

#include "k8s_calc.h"

const char plugin_name[] = "Kubernetes resources node_features plugin";
const char plugin_type[] = "node_features/k8s_resources";
const uint32_t plugin_version = SLURM_VERSION_NUMBER;

/* Reported by slurmd as its active features so that slurmctld calls
 * node_features_p_node_update() at every registration; never stored. */
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
	gpus = k8s_gres_count(node_ptr->config_ptr ? node_ptr->config_ptr->gres :
			      node_ptr->gres, "gpu");
	cpus = _minus(node_ptr->cpus, held_cpus);
	mem = _minus(node_ptr->real_memory - node_ptr->mem_spec_limit, held_mem);

	if (!node_ptr->gres && node_ptr->config_ptr)
		node_ptr->gres = xstrdup(node_ptr->config_ptr->gres);
	gres_node_feature(node_ptr->name, "k8scpu", cpus, &node_ptr->gres,
			  &node_ptr->gres_list);
	gres_node_feature(node_ptr->name, "k8smemory", mem, &node_ptr->gres,
			  &node_ptr->gres_list);
	if (gpus)
		gres_node_feature(node_ptr->name, "k8sgpu", _minus(gpus, held_gpus),
				  &node_ptr->gres, &node_ptr->gres_list);
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

/* slurmctld, at every node registration (via the active features mark). */
extern int node_features_p_node_update(char *active_features,
				       bitstr_t *node_bitmap)
{
	node_record_t *node_ptr;

	if (!node_bitmap)
		return SLURM_SUCCESS;
	for (int i = 0; (node_ptr = next_node_bitmap(node_bitmap, &i)); i++)
		_size_node(node_ptr);
	return SLURM_SUCCESS;
}

/* slurmd: report the mark so that registration reaches node_update. */
extern void node_features_p_node_state(char **avail_modes, char **current_mode)
{
	if (!*current_mode)
		*current_mode = xstrdup(REGISTRATION_MARK);
}

/* Keep the node's active features exactly as they were: the mark is not one. */
extern char *node_features_p_node_xlate(char *new_features, char *orig_features,
					char *avail_features, int node_inx)
{
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

extern int node_features_p_get_node(char *node_list)
{
	return SLURM_SUCCESS;
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

extern bool node_features_p_node_power(void)
{
	return false;
}

extern int node_features_p_node_set(char *active_features, bool *need_reboot)
{
	if (need_reboot)
		*need_reboot = false;
	return SLURM_SUCCESS;
}

extern bool node_features_p_node_update_valid(void *node_ptr,
					      update_node_msg_t *update_node_msg)
{
	return true;
}

extern void node_features_p_step_config(bool mem_sort, bitstr_t *numa_bitmap)
{
}

extern bool node_features_p_user_update(uid_t uid)
{
	return false;	/* nothing to reboot for */
}

extern void node_features_p_get_config(config_plugin_params_t *p)
{
	xstrcat(p->name, plugin_type);
}
