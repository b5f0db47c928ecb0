/*****************************************************************************\
 *  k8s_slurm_compat.h - every difference between the Slurm releases the
 *  plugins are built for (24.11, 25.11, 26.05), in one place.
 *
 *  Included after Slurm's own headers. The plugins test these names, never
 *  SLURM_VERSION_NUMBER directly.
\*****************************************************************************/

#ifndef _K8S_SLURM_COMPAT_H
#define _K8S_SLURM_COMPAT_H

#include <slurm/slurm.h>

#define K8S_SLURM_AT_LEAST(major, minor) \
	(SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(major, minor, 0))

/* 25.11 turned the CR_* SelectTypeParameters macros into SELECT_* enum values. */
#ifdef CR_SOCKET
#define K8S_SELECT_SOCKET CR_SOCKET
#else
#define K8S_SELECT_SOCKET SELECT_SOCKET
#endif

/*
 * The node_features interface (syms[] in src/interfaces/node_features.c):
 * up to 24.11 slurmctld calls get_node() once the saved node state is loaded
 * at start and reconfigure, and needs node_power(), node_update(),
 * node_update_valid() and step_config(); 25.11 dropped all five (there is no
 * call left at slurmctld start); 26.05 added job_features_need_reboot().
 */
#define K8S_NF_HAS_START_HOOK (!K8S_SLURM_AT_LEAST(25, 11))
#define K8S_NF_HAS_NEED_REBOOT K8S_SLURM_AT_LEAST(26, 5)

/*
 * Slurm's joinable-thread helper: 26.05 moved it to the thread pool
 * (src/common/threadpool.h) and added the thread's name as first argument.
 * Both fatal() when no thread can be made, as every slurmctld thread does.
 */
#if K8S_SLURM_AT_LEAST(26, 5)
#include "src/common/threadpool.h"
#define K8S_THREAD_CREATE(name, id, func, arg) \
	slurm_thread_create(name, id, func, arg)
#else
#include "src/common/macros.h"
#define K8S_THREAD_CREATE(name, id, func, arg) \
	slurm_thread_create(id, func, arg)
#endif

#endif /* _K8S_SLURM_COMPAT_H */
