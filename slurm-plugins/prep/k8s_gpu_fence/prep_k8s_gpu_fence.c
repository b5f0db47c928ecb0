/*****************************************************************************\
 *  prep_k8s_gpu_fence.c - withhold every GPU of a node the moment a
 *  nodeledger hold job there ends, before any job can be given its device.
 *
 *  A hold job (name "nodeledger-hold", SlurmUser's or root's) keeps a pod's
 *  exact GPU device from Slurm's jobs. Whichever way it ends (scancel,
 *  requeue, preemption, a time limit, its node going DOWN), slurmctld frees
 *  its device in deallocate_nodes() and the next job that fits the node's
 *  k8sgpu count is given the lowest free device: the pod's. Slurm cannot
 *  lower one device's count at runtime ("Attempt to change gres/gpu Count
 *  ... invalid with File configuration"), so the whole k8sgpu count goes to
 *  0. slurmctld calls epilog_slurmctld() from deallocate_nodes() with the job
 *  and node write locks held, after the resources are freed and before any
 *  scheduler can run: the count is lowered in the same critical section.
 *
 *  The same state is written into the node's extra field (the GPUs Kubernetes
 *  holds set to all of the node's), where nodeledger writes it itself for a
 *  lost hold and node_features/k8s_resources reads it when the node
 *  registers again: a node back from DOWN (ReturnToService=2) or a restarted
 *  slurmctld keeps every GPU withheld too. nodeledger lifts it once it holds
 *  the devices again, or at once when it ended the hold itself (a release).
\*****************************************************************************/

#include <inttypes.h>
#include <string.h>
#include <time.h>

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>

#include "src/common/bitstring.h"
#include "src/common/log.h"
#include "src/common/node_conf.h"
#include "src/common/read_config.h"
#include "src/common/run_in_daemon.h"
#include "src/common/xmalloc.h"
#include "src/common/xstring.h"
#include "src/interfaces/prep.h"
#include "src/slurmctld/slurmctld.h"

#include "k8s_calc.h"
#include "k8s_gres.h"

const char plugin_name[] = "nodeledger GPU fence PrEp plugin";
const char plugin_type[] = "prep/k8s_gpu_fence";
const uint32_t plugin_version = SLURM_VERSION_NUMBER;

#define HOLD_JOB_NAME "nodeledger-hold"
#define RELEASED_COMMENT "nodeledger-released:"

extern int init(void)
{
	return SLURM_SUCCESS;
}

extern void fini(void)
{
}

extern void prep_p_register_callbacks(prep_callbacks_t *callbacks)
{
}

extern int prep_p_prolog(job_env_t *job_env, slurm_cred_t *cred)
{
	return SLURM_SUCCESS;
}

extern int prep_p_epilog(job_env_t *job_env, slurm_cred_t *cred)
{
	return SLURM_SUCCESS;
}

extern int prep_p_prolog_slurmctld(job_record_t *job_ptr, bool *async)
{
	*async = false;
	return SLURM_SUCCESS;
}

/*
 * A nodeledger hold job: the name, from SlurmUser or root (as job_submit),
 * unless nodeledger marked it released before cancelling it (its pod's
 * holding is gone: the device is free to give).
 */
static bool _hold_job(job_record_t *job_ptr)
{
	return !xstrcmp(job_ptr->name, HOLD_JOB_NAME) &&
	       ((job_ptr->user_id == 0) ||
		(job_ptr->user_id == slurm_conf.slurm_user_id)) &&
	       xstrncmp(job_ptr->comment, RELEASED_COMMENT,
			strlen(RELEASED_COMMENT));
}

/* Withhold every GPU of one node, in its counts and in its extra field. */
static void _fence(node_record_t *node_ptr, job_record_t *job_ptr)
{
	uint64_t gpus = k8s_gres_count(node_ptr->config_ptr ?
				       node_ptr->config_ptr->gres :
				       node_ptr->gres, "gpu");
	size_t len;
	char *extra;

	if (!gpus)
		return;
	k8s_set_total(node_ptr, "k8sgpu", 0);
	len = (node_ptr->extra ? strlen(node_ptr->extra) : 0) + 32;
	extra = xmalloc(len);
	/*
	 * Only a number changes: extra_data, the parse slurmctld matches jobs'
	 * extra constraints against, is left as it is (they name the
	 * "nodeledger" key alone; an update or a restart parses it again).
	 */
	if (!k8s_extra_set_gpus(node_ptr->extra, gpus, extra, len)) {
		xfree(node_ptr->extra);
		node_ptr->extra = extra;
	} else {
		xfree(extra);
	}
	last_node_update = time(NULL);
	info("%s: %pJ ended: every GPU of node %s withheld until nodeledger holds its devices again",
	     plugin_type, job_ptr, node_ptr->name);
}

extern int prep_p_epilog_slurmctld(job_record_t *job_ptr, bool *async)
{
	node_record_t *node_ptr;

	*async = false;
	if (!_hold_job(job_ptr) || !job_ptr->node_bitmap)
		return SLURM_SUCCESS;
	for (int i = 0; (node_ptr = next_node_bitmap(job_ptr->node_bitmap, &i));
	     i++)
		_fence(node_ptr, job_ptr);
	return SLURM_SUCCESS;
}

extern void prep_p_required(prep_call_type_t type, bool *required)
{
	*required = (type == PREP_EPILOG_SLURMCTLD) && running_in_slurmctld();
}
