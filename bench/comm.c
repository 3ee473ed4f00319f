// bench_comm: `l3d bench comm` as a standalone program (same flags; see cli/bench_comm.c).
#include "cli/cli.h"

int main(int argc, char **argv) {
    return l3d_cli_finish_stdout(l3d_bench_comm_main(argc, argv, 1));
}
