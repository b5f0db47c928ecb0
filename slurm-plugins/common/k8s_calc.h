/*****************************************************************************\
 *  k8s_calc.h - what a Slurm job holds per node, in k8scpu/k8smemory/k8sgpu.
 *
 *  Pure functions (no slurmctld, no allocation): the job_submit plugin feeds
 *  them the request, the node shape and the defaults; the node_features plugin
 *  uses the GRES and "extra" parsers. Covered by test_k8s_calc.c.
\*****************************************************************************/

#ifndef _K8S_CALC_H
#define _K8S_CALC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The largest node the job may land on (never undercount: take the maximum). */
typedef struct {
	uint32_t cpus;
	uint16_t threads_per_core;
	uint16_t sockets;	/* sockets per node */
	uint32_t socket_cpus;	/* CPUs per socket with CR_Socket, else 0 */
	uint64_t memory_mb;	/* RealMemory - MemSpecLimit */
	uint64_t gpus;
	uint64_t gpus_everywhere; /* GPUs every node has (0 if one has none) */
} k8s_node_shape_t;

/* Partition (else cluster) defaults and limits, resolved; 0 = not set. */
typedef struct {
	uint64_t mem_per_cpu;	/* MB, DefMemPerCPU */
	uint64_t mem_per_node;	/* MB, DefMemPerNode */
	uint64_t mem_per_gpu;	/* MB, DefMemPerGPU */
	uint64_t cpus_per_gpu;	/* DefCpuPerGPU */
	uint64_t max_mem_per_cpu; /* MB, MaxMemPerCPU: Slurm adds CPUs for it */
} k8s_defaults_t;

/* The job's request as slurmctld holds it: unset = NO_VAL* or NULL. */
typedef struct {
	uint32_t min_nodes;
	uint32_t num_tasks;
	uint16_t ntasks_per_node;
	uint16_t cpus_per_task;
	uint16_t pn_min_cpus;		/* --mincpus */
	uint16_t threads_per_core;	/* --threads-per-core; 1 with --hint=
					 * nomultithread|compute_bound|
					 * memory_bound */
	uint16_t ntasks_per_core;	/* INFINITE16 = --hint=multithread */
	uint16_t ntasks_per_socket;
	uint16_t ntasks_per_tres;	/* --ntasks-per-gpu */
	bool exclusive;			/* or OverSubscribe=EXCLUSIVE */
	uint64_t pn_min_memory;		/* --mem, --mem-per-cpu | MEM_PER_CPU */
	const char *tres_per_node;	/* "gres/gpu:2,gres/k8scpu:4" */
	const char *tres_per_job;	/* --gpus */
	const char *tres_per_task;	/* --gpus-per-task, "cpu=N" */
	const char *tres_per_socket;	/* --gpus-per-socket */
	const char *cpus_per_tres;	/* --cpus-per-gpu */
	const char *mem_per_tres;	/* --mem-per-gpu */
} k8s_request_t;

typedef struct {
	uint64_t cpus;
	uint64_t memory_mb;
	uint64_t gpus;
	uint16_t ntasks_per_node;	/* to set on the job, or NO_VAL16 */
} k8s_counts_t;

/*
 * Per-node counts for a request. Returns 0, or -1 with a message for the user
 * in why[] when the request cannot be expressed per node.
 */
extern int k8s_compute(const k8s_request_t *req, const k8s_node_shape_t *node,
		       const k8s_defaults_t *defaults, k8s_counts_t *out,
		       char *why, size_t why_len);

/* Count of a TRES in "gres/gpu:2,gres/gpu:a100:1,cpu=4" (all types summed). */
extern uint64_t k8s_tres_count(const char *tres, const char *name);

/*
 * tres_per_node with our entries set to counts (others kept, in order).
 * Returns 0, or -1 when out[] is too small.
 */
extern int k8s_tres_merge(const char *tres, const k8s_counts_t *counts,
			  char *out, size_t out_len);

/* Count of a GRES in a node's Gres string "gpu:tesla:4(S:0-1),k8scpu:16". */
extern uint64_t k8s_gres_count(const char *gres, const char *name);

/*
 * What Kubernetes holds on a node, from what the nodeledger service writes
 * into the node's extra field: the token "nodeledger=k8scpu:C,k8smemory:M,
 * k8sgpu:G", or, when the field is a JSON object, its keys
 * "nodeledger_k8scpu", "nodeledger_k8smemory" and "nodeledger_k8sgpu".
 * Returns true when present.
 */
extern bool k8s_extra_held(const char *extra, uint64_t *cpus,
			   uint64_t *memory_mb, uint64_t *gpus);

/*
 * "extra" with the GPUs Kubernetes holds there set to "gpus" (the number in
 * either form k8s_extra_held() reads), into out[]. Returns 0, or -1 when
 * "extra" names no held GPUs or out[] is too small.
 */
extern int k8s_extra_set_gpus(const char *extra, uint64_t gpus, char *out,
			      size_t out_len);

#endif
