/*****************************************************************************\
 *  job_submit_k8s_resource_completion.c - add k8scpu/k8smemory/k8sgpu GRES to
 *  every job, computed from its CPU, memory and GPU request.
 *
 *  The nodeledger service lowers each node's k8scpu/k8smemory/k8sgpu counts by
 *  what Kubernetes pods hold there. A job that requests those GRES in
 *  proportion to what Slurm will really allocate can then never be placed on
 *  resources a pod holds, and users just sbatch as usual.
 *
 *  Runs with slurmctld's locks held: no blocking, no network. The calculation
 *  itself lives in common/k8s_calc.c (pure, unit tested).
\*****************************************************************************/

#include <string.h>

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>

#include "src/common/list.h"
#include "src/common/node_conf.h"
#include "src/common/xmalloc.h"
#include "src/common/xstring.h"
#include "src/slurmctld/slurmctld.h"

#include "k8s_calc.h"
#include "k8s_slurm_compat.h"

const char plugin_name[] = "Kubernetes resource completion job_submit plugin";
const char plugin_type[] = "job_submit/k8s_resource_completion";
const uint32_t plugin_version = SLURM_VERSION_NUMBER;

/* The largest node of the partition (of all without one): no undercount. */
static void _node_shape(part_record_t *part, k8s_node_shape_t *shape)
{
	bool by_socket = slurm_conf.select_type_param & K8S_SELECT_SOCKET;
	node_record_t *node_ptr;
	uint64_t memory, gpus;

	memset(shape, 0, sizeof(*shape));
	shape->gpus_everywhere = UINT64_MAX;
	for (int i = 0;
	     (node_ptr = part ? next_node_bitmap(part->node_bitmap, &i) :
	      next_node(&i)); i++) {
		memory = node_ptr->real_memory - node_ptr->mem_spec_limit;
		gpus = k8s_gres_count(node_ptr->config_ptr ?
				      node_ptr->config_ptr->gres : NULL, "gpu");
		shape->cpus = MAX(shape->cpus, node_ptr->cpus);
		shape->threads_per_core = MAX(shape->threads_per_core,
					      node_ptr->tpc);
		shape->sockets = MAX(shape->sockets, node_ptr->tot_sockets);
		if (by_socket)	/* CR_Socket allocates whole sockets */
			shape->socket_cpus = MAX(shape->socket_cpus,
						 node_ptr->cores *
						 node_ptr->tpc);
		shape->memory_mb = MAX(shape->memory_mb, memory);
		shape->gpus = MAX(shape->gpus, gpus);
		shape->gpus_everywhere = MIN(shape->gpus_everywhere, gpus);
	}
	if (shape->gpus_everywhere == UINT64_MAX)
		shape->gpus_everywhere = 0;
}

static int _job_default(void *x, void *arg)
{
	job_defaults_t *job_default = x;
	k8s_defaults_t *defaults = arg;

	if (job_default->type == JOB_DEF_CPU_PER_GPU)
		defaults->cpus_per_gpu = job_default->value;
	else if (job_default->type == JOB_DEF_MEM_PER_GPU)
		defaults->mem_per_gpu = job_default->value;
	return 0;
}

static bool _mem_set(uint64_t mem)
{
	return mem && (mem != NO_VAL64);
}

/*
 * Defaults slurmctld applies only after job_submit, and MaxMemPerCPU: the
 * partition's, else the cluster's.
 */
static void _defaults(part_record_t *part, k8s_defaults_t *defaults)
{
	uint64_t mem = (part && _mem_set(part->def_mem_per_cpu)) ?
		part->def_mem_per_cpu : slurm_conf.def_mem_per_cpu;
	uint64_t max = (part && _mem_set(part->max_mem_per_cpu)) ?
		part->max_mem_per_cpu : slurm_conf.max_mem_per_cpu;
	list_t *job_defaults = (part && part->job_defaults_list) ?
		part->job_defaults_list : slurm_conf.job_defaults_list;

	memset(defaults, 0, sizeof(*defaults));
	if (_mem_set(mem) && (mem & MEM_PER_CPU))
		defaults->mem_per_cpu = mem & ~MEM_PER_CPU;
	else if (_mem_set(mem))
		defaults->mem_per_node = mem;
	if (_mem_set(max) && (max & MEM_PER_CPU))
		defaults->max_mem_per_cpu = max & ~MEM_PER_CPU;
	if (job_defaults)
		list_for_each(job_defaults, _job_default, defaults);
}

/* Counts if the job runs in this partition; -1 if no node there holds them. */
static int _compute_in(const k8s_request_t *req, part_record_t *part,
		       k8s_counts_t *counts, char *why, size_t why_len)
{
	k8s_request_t in_part = *req;
	k8s_node_shape_t shape;
	k8s_defaults_t defaults;

	if (part && (part->max_share == 0))
		in_part.exclusive = true;	/* OverSubscribe=EXCLUSIVE */
	_node_shape(part, &shape);
	_defaults(part, &defaults);
	return k8s_compute(&in_part, &shape, &defaults, counts, why, why_len);
}

typedef int (*part_fn_t)(part_record_t *part, void *arg);

/*
 * fn for each partition the job names (NULL for a name slurmctld does not know:
 * it rejects the job itself, and says why), or for the default partition when
 * it names none. Stops at the first non-zero return, and returns it.
 */
static int _each_part(const char *partitions, part_fn_t fn, void *arg)
{
	char *copy, *name, *save = NULL;
	int rc = 0;

	if (!partitions)
		return fn(default_part_loc, arg);
	copy = xstrdup(partitions);
	for (name = strtok_r(copy, ",", &save); name && !rc;
	     name = strtok_r(NULL, ",", &save))
		rc = fn(find_part_record(name), arg);
	xfree(copy);
	return rc;
}

typedef struct {
	const k8s_request_t *req;
	k8s_counts_t *counts;
	char *why;
	size_t why_len;
	int rc;		/* -1 until the job fits in a partition */
} compute_arg_t;

/* Keep the largest counts over the partitions where the job fits. */
static int _compute_part(part_record_t *part, void *x)
{
	compute_arg_t *arg = x;
	char part_why[256];
	k8s_counts_t one;

	if (!part)
		return 0;
	if (_compute_in(arg->req, part, &one, part_why, sizeof(part_why))) {
		if (arg->rc)
			snprintf(arg->why, arg->why_len, "%s", part_why);
		return 0;
	}
	if (arg->rc) {
		*arg->counts = one;
		arg->rc = 0;
		return 0;
	}
	arg->counts->cpus = MAX(arg->counts->cpus, one.cpus);
	arg->counts->memory_mb = MAX(arg->counts->memory_mb, one.memory_mb);
	arg->counts->gpus = MAX(arg->counts->gpus, one.gpus);
	return 0;
}

/*
 * The job may run in any partition it names: take the largest counts over those
 * where it fits. Rejected only when it fits in none.
 */
static int _compute(const k8s_request_t *req, const char *partitions,
		    k8s_counts_t *counts, char *why, size_t why_len)
{
	compute_arg_t arg = { req, counts, why, why_len, -1 };

	(void) _each_part(partitions, _compute_part, &arg);
	if (arg.rc && !why[0])	/* no known partition: leave it to slurmctld */
		return _compute_in(req, default_part_loc, counts, why, why_len);
	return arg.rc;
}

/* Compute the counts and write them into job_desc->tres_per_node. */
static int _complete(job_desc_msg_t *job_desc, const k8s_request_t *req,
		     const char *base_tres, const char *partitions,
		     char **err_msg)
{
	k8s_counts_t counts;
	char why[256] = "";
	size_t len = (base_tres ? strlen(base_tres) : 0) + 128;
	char *tres;

	if (_compute(req, partitions, &counts, why, sizeof(why))) {
		*err_msg = xstrdup_printf("%s: %s", plugin_type, why);
		info("%s: %s: rejected: %s", plugin_type, __func__, why);
		return ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE;
	}
	tres = xmalloc(len);
	if (k8s_tres_merge(base_tres, &counts, tres, len)) {
		xfree(tres);
		*err_msg = xstrdup_printf("%s: TRES request too long",
					  plugin_type);
		return ESLURM_INVALID_TRES;
	}
	xfree(job_desc->tres_per_node);
	job_desc->tres_per_node = tres;
	if ((counts.ntasks_per_node != NO_VAL16) &&
	    (job_desc->ntasks_per_node == NO_VAL16))
		job_desc->ntasks_per_node = counts.ntasks_per_node;
	debug("%s: %s: tres_per_node=%s", plugin_type, __func__, tres);
	return SLURM_SUCCESS;
}

/*
 * Jobs queue behind what pods hold instead of failing at submit (issue 31).
 * A job asking for more k8s GRES than any node's current total is refused at
 * submit ("Requested node configuration is not available"), unless it has an
 * extra constraint: with SchedulerParameters=extra_constraints slurmctld then
 * keeps it pending, Reason=Constraints, and tests it again at every pass, so it
 * starts once the totals rise (node_scheduler.c: "assume that the job might be
 * runnable at some point in the future"; 24.11 and 26.05). The constraint names
 * the key the nodeledger service writes into the Extra of every node it keeps
 * (NODELEDGER_SLURM_JOBS_QUEUE). Added only when every node the job may run on
 * carries that key, so that it never keeps a job off a node; never over a
 * constraint of the user's own.
 */
#define K8S_EXTRA_MARKER "\"nodeledger\":1"
#define K8S_EXTRA_CONSTRAINT "nodeledger=1"

static bool _marked(part_record_t *part)
{
	node_record_t *node_ptr;
	bool any = false;

	for (int i = 0;
	     (node_ptr = part ? next_node_bitmap(part->node_bitmap, &i) :
	      next_node(&i)); i++) {
		if (!node_ptr->extra || !strstr(node_ptr->extra, K8S_EXTRA_MARKER))
			return false;
		any = true;
	}
	return any;
}

/* Non-zero for a partition (or a name) with a node the service does not mark. */
static int _unmarked(part_record_t *part, void *arg)
{
	return !part || !_marked(part);
}

static void _queue_behind_pods(job_desc_msg_t *job_desc)
{
	if ((job_desc->extra && job_desc->extra[0]) ||
	    !xstrcasestr(slurm_conf.sched_params, "extra_constraints") ||
	    _each_part(job_desc->partition, _unmarked, NULL))
		return;
	xfree(job_desc->extra);
	job_desc->extra = xstrdup(K8S_EXTRA_CONSTRAINT);
	debug("%s: %s: extra=%s", plugin_type, __func__, job_desc->extra);
}

extern int init(void)
{
	return SLURM_SUCCESS;
}

extern void fini(void)
{
}

/*
 * nodeledger's GPU hold jobs (name "nodeledger-hold", submitted as SlurmUser or
 * root) get no k8s GRES: the pushed counts already withhold their pod's CPUs,
 * memory and GPUs, so that a hold that ends exposes none of them (issue 30).
 * Anyone else's job of that name is completed as usual.
 */
static bool _hold_job(const job_desc_msg_t *job_desc, uint32_t submit_uid)
{
	return job_desc->name && !xstrcmp(job_desc->name, "nodeledger-hold") &&
		((submit_uid == 0) || (submit_uid == slurm_conf.slurm_user_id));
}

extern int job_submit(job_desc_msg_t *job_desc, uint32_t submit_uid,
		      char **err_msg)
{
	k8s_request_t req = {
		.min_nodes = job_desc->min_nodes,
		.num_tasks = job_desc->num_tasks,
		.ntasks_per_node = job_desc->ntasks_per_node,
		.cpus_per_task = job_desc->cpus_per_task,
		.pn_min_cpus = job_desc->pn_min_cpus,
		.threads_per_core = job_desc->threads_per_core,
		.ntasks_per_core = job_desc->ntasks_per_core,
		.ntasks_per_socket = job_desc->ntasks_per_socket,
		.ntasks_per_tres = job_desc->ntasks_per_tres,
		.exclusive = (job_desc->shared == JOB_SHARED_NONE),
		.pn_min_memory = job_desc->pn_min_memory,
		.tres_per_node = job_desc->tres_per_node,
		.tres_per_job = job_desc->tres_per_job,
		.tres_per_task = job_desc->tres_per_task,
		.tres_per_socket = job_desc->tres_per_socket,
		.cpus_per_tres = job_desc->cpus_per_tres,
		.mem_per_tres = job_desc->mem_per_tres,
	};
	int rc;

	if (_hold_job(job_desc, submit_uid))
		return SLURM_SUCCESS;
	rc = _complete(job_desc, &req, job_desc->tres_per_node,
		       job_desc->partition, err_msg);
	if (rc == SLURM_SUCCESS)
		_queue_behind_pods(job_desc);
	return rc;
}

/* Did this update touch anything the counts depend on? */
static bool _request_changed(const job_desc_msg_t *d)
{
	return (d->min_nodes != NO_VAL) || (d->num_tasks != NO_VAL) ||
		(d->ntasks_per_node != NO_VAL16) ||
		(d->cpus_per_task != NO_VAL16) ||
		(d->pn_min_cpus != NO_VAL16) || (d->shared != NO_VAL16) ||
		(d->threads_per_core != NO_VAL16) ||
		(d->ntasks_per_core != NO_VAL16) ||
		(d->ntasks_per_socket != NO_VAL16) ||
		(d->ntasks_per_tres != NO_VAL16) ||
		(d->pn_min_memory != NO_VAL64) || d->tres_per_node ||
		d->tres_per_job || d->tres_per_task || d->tres_per_socket ||
		d->cpus_per_tres || d->mem_per_tres || d->partition;
}

/*
 * job_modify receives only the changed fields: merge them with the job's
 * current request, recompute, and replace our entries in its tres_per_node.
 */
extern int job_modify(job_desc_msg_t *job_desc, job_record_t *job_ptr,
		      uint32_t submit_uid, char **err_msg)
{
	job_details_t *details = job_ptr->details;
	multi_core_data_t *mc = details ? details->mc_ptr : NULL;
	k8s_counts_t none = { 0, 0, 0, NO_VAL16 };
	const char *current = job_desc->tres_per_node ?
		job_desc->tres_per_node : job_ptr->tres_per_node;
	size_t len = (current ? strlen(current) : 0) + 1;
	char *base;
	int rc;

	if (!details || !IS_JOB_PENDING(job_ptr) || !_request_changed(job_desc))
		return SLURM_SUCCESS;	/* e.g. release, hold, priority */

	/* Our previous entries are not the user's: drop, then recompute. */
	base = xmalloc(len);
	if (k8s_tres_merge(current, &none, base, len)) {
		xfree(base);
		return SLURM_SUCCESS;
	}
	k8s_request_t req = {
		.min_nodes = (job_desc->min_nodes != NO_VAL) ?
			job_desc->min_nodes : details->min_nodes,
		.num_tasks = (job_desc->num_tasks != NO_VAL) ?
			job_desc->num_tasks : details->num_tasks,
		.ntasks_per_node = (job_desc->ntasks_per_node != NO_VAL16) ?
			job_desc->ntasks_per_node : details->ntasks_per_node,
		.cpus_per_task = (job_desc->cpus_per_task != NO_VAL16) ?
			job_desc->cpus_per_task : details->cpus_per_task,
		.pn_min_cpus = (job_desc->pn_min_cpus != NO_VAL16) ?
			job_desc->pn_min_cpus : details->pn_min_cpus,
		.threads_per_core = (job_desc->threads_per_core != NO_VAL16) ?
			job_desc->threads_per_core : mc ? mc->threads_per_core :
			NO_VAL16,
		.ntasks_per_core = (job_desc->ntasks_per_core != NO_VAL16) ?
			job_desc->ntasks_per_core : mc ? mc->ntasks_per_core :
			NO_VAL16,
		.ntasks_per_socket = (job_desc->ntasks_per_socket != NO_VAL16) ?
			job_desc->ntasks_per_socket :
			mc ? mc->ntasks_per_socket : NO_VAL16,
		.ntasks_per_tres = (job_desc->ntasks_per_tres != NO_VAL16) ?
			job_desc->ntasks_per_tres : details->ntasks_per_tres,
		.exclusive = (job_desc->shared != NO_VAL16) ?
			(job_desc->shared == JOB_SHARED_NONE) :
			(details->whole_node & WHOLE_NODE_REQUIRED),
		.pn_min_memory = (job_desc->pn_min_memory != NO_VAL64) ?
			job_desc->pn_min_memory : details->pn_min_memory,
		.tres_per_node = job_desc->tres_per_node ?
			job_desc->tres_per_node : base,
		.tres_per_job = job_desc->tres_per_job ?
			job_desc->tres_per_job : job_ptr->tres_per_job,
		.tres_per_task = job_desc->tres_per_task ?
			job_desc->tres_per_task : job_ptr->tres_per_task,
		.tres_per_socket = job_desc->tres_per_socket ?
			job_desc->tres_per_socket : job_ptr->tres_per_socket,
		.cpus_per_tres = job_desc->cpus_per_tres ?
			job_desc->cpus_per_tres : job_ptr->cpus_per_tres,
		.mem_per_tres = job_desc->mem_per_tres ?
			job_desc->mem_per_tres : job_ptr->mem_per_tres,
	};
	rc = _complete(job_desc, &req, base, job_desc->partition ?
		       job_desc->partition : job_ptr->partition, err_msg);
	xfree(base);
	return rc;
}
