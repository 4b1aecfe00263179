# cmake -DCOMMAND=<writescope> -DPYTHON=<python3> -DFOLDER=<dir> -P generate_failure.cmake
# A generation that fails part-way (here the KV cache runs out of room at the
# 271st token) prints the tokens it made, says where it stopped, and keeps
# those tokens and their logits in the --logits file, committed with the error.
file(REMOVE_RECURSE "${FOLDER}")
file(MAKE_DIRECTORY "${FOLDER}")
execute_process(COMMAND ${COMMAND} generate --model tiny-mixtral --prompt 1,2,3 --new-tokens 300 --block-tokens 16
                        --vram-budget 300KiB --host-budget 4KiB --chunk-tokens 8 --logits ${FOLDER}/logits.h5
                        --kokkos-threads=2
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX MATCHALL "[0-9]+" tokens "${out}")
list(LENGTH tokens printed)
if(NOT status EQUAL 1 OR NOT printed EQUAL 270 OR
   NOT err MATCHES "warning: the prompt and the new tokens need 38 KV blocks \\(2 layers x 19 of 16 tokens\\) but --vram-budget and --host-budget hold [0-9]+: it stops at about position" OR
   NOT err MATCHES "decoding token 271: KV cache: no room.*the 270 tokens before it and their logits are in .*logits.h5:/generate_0")
  message(FATAL_ERROR "status ${status}, ${printed} tokens printed; stderr:\n${err}")
endif()
execute_process(COMMAND ${PYTHON} -c "
import sys, h5py
g = h5py.File(sys.argv[1], 'r')['generate_0']
assert g['logits'].shape == (270, 256), g['logits'].shape
assert list(g['generated'][:]) == [int(t) for t in sys.argv[2].split()], 'tokens differ from the printed ones'
assert g.attrs['steps'] == 270 and g.attrs['complete'] == 0 and g.attrs['status'] == 'failed', dict(g.attrs)
assert 'decoding token 271' in g.attrs['error'], g.attrs['error']
# What reproduces it: the command and every setting that changes the logits, the CPU attention's path among them.
# The command as typed, Kokkos' options (which Kokkos takes out of argv) included.
assert g.attrs['command'].startswith('writescope generate --model tiny-mixtral --prompt 1,2,3 --new-tokens 300 '), g.attrs['command']
assert g.attrs['command'].endswith(' --kokkos-threads=2'), g.attrs['command']
settings = {k: int(g.attrs[k]) for k in ('new_tokens', 'block_tokens', 'chunk_tokens', 'vram_budget', 'host_budget', 'seed')}
assert settings == dict(new_tokens=300, block_tokens=16, chunk_tokens=8, vram_budget=300 * 1024, host_budget=4096, seed=1), settings
assert g.attrs['cpu_decode_path'].startswith('head-major: '), g.attrs['cpu_decode_path']
assert 'mla_form' not in g.attrs
assert g.file.attrs['format'] == 'writescope-logits-1', dict(g.file.attrs)
" ${FOLDER}/logits.h5 "${out}" RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "the logits file does not hold the steps before the failure:\n${err}")
endif()

# Another program's HDF5 file (or a results file) takes no generation: one
# error, before any step, and the file as it was, with no lock file beside it.
execute_process(COMMAND ${PYTHON} -c "
import sys, h5py
with h5py.File(sys.argv[1], 'w') as f:
    f['data'] = [1, 2, 3]
" ${FOLDER}/foreign.h5 RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "could not write the foreign file:\n${err}")
endif()
file(SHA256 ${FOLDER}/foreign.h5 before)
execute_process(COMMAND ${COMMAND} generate --model tiny-mixtral --prompt 1 --new-tokens 2 --logits ${FOLDER}/foreign.h5
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(SHA256 ${FOLDER}/foreign.h5 after)
if(NOT status EQUAL 1 OR NOT before STREQUAL after OR EXISTS ${FOLDER}/foreign.h5.lock OR
   NOT err MATCHES "generate: --logits .*/foreign.h5 is not a logits file of writescope generate \\(format 'none'\\); name another file")
  message(FATAL_ERROR "status ${status}, foreign file changed: ${before} -> ${after}; stderr:\n${err}")
endif()

# Nor does a file whose root holds only another program's attribute.
execute_process(COMMAND ${PYTHON} -c "
import sys, h5py
with h5py.File(sys.argv[1], 'w') as f:
    f.attrs['foo'] = 1
" ${FOLDER}/attributes.h5 RESULT_VARIABLE status ERROR_VARIABLE err)
file(SHA256 ${FOLDER}/attributes.h5 before)
execute_process(COMMAND ${COMMAND} generate --model tiny-mixtral --prompt 1 --new-tokens 2 --logits ${FOLDER}/attributes.h5
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(SHA256 ${FOLDER}/attributes.h5 after)
if(NOT status EQUAL 1 OR NOT before STREQUAL after OR NOT err MATCHES "attributes.h5 is not a logits file")
  message(FATAL_ERROR "status ${status}, attribute-only file changed: ${before} -> ${after}; stderr:\n${err}")
endif()
file(REMOVE_RECURSE "${FOLDER}")

# A model that cannot be built ran no step: the --logits file it would have
# created is not left behind, empty.
file(MAKE_DIRECTORY "${FOLDER}")
execute_process(COMMAND ${COMMAND} generate --model tiny-mixtral --prompt 1 --new-tokens 2 --host-budget 4096TiB
                        --logits ${FOLDER}/unbuilt.h5
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR NOT err MATCHES "host memory: tiny-mixtral" OR EXISTS ${FOLDER}/unbuilt.h5)
  message(FATAL_ERROR "status ${status}, the empty logits file left: ${FOLDER}/unbuilt.h5; stderr:\n${err}")
endif()
file(REMOVE_RECURSE "${FOLDER}")

# Asked to stop (SIGINT) or with its output closed (`| head`), a generation
# stops after the step in progress and commits the tokens it made, saying why.
find_program(TIMEOUT timeout REQUIRED)
file(MAKE_DIRECTORY "${FOLDER}")
execute_process(COMMAND ${TIMEOUT} --preserve-status -s INT 5 ${COMMAND} generate --model tiny-mixtral --prompt 1
                        --new-tokens 200000 --logits ${FOLDER}/interrupted.h5
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 130 OR NOT err MATCHES "generate: stopped by SIGINT after [0-9]+ of 200000 tokens; their logits are in .*interrupted.h5:/generate_0")
  message(FATAL_ERROR "status ${status}; stderr:\n${err}")
endif()
execute_process(COMMAND ${COMMAND} generate --model tiny-mixtral --prompt 1 --new-tokens 200000 --logits ${FOLDER}/closed.h5
  COMMAND head -c 8
  RESULTS_VARIABLE statuses OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT statuses STREQUAL "1;0" OR NOT err MATCHES "generate: standard output closed after [0-9]+ of 200000 tokens"
   OR err MATCHES "could not be written")  # said once, not again by the command line's final flush
  message(FATAL_ERROR "statuses ${statuses}; stderr:\n${err}")
endif()
execute_process(COMMAND ${PYTHON} -c "
import sys, h5py
for path, why in ((sys.argv[1], 'stopped by SIGINT'), (sys.argv[2], 'standard output closed')):
    g = h5py.File(path, 'r')['generate_0']
    steps = int(g.attrs['steps'])
    assert g.attrs['status'] == 'stopped' and g.attrs['stopped'] == why and g.attrs['complete'] == 0, dict(g.attrs)
    assert 0 < steps < 200000 and g['logits'].shape == (steps, 256) and len(g['generated']) == steps, (path, steps)
" ${FOLDER}/interrupted.h5 ${FOLDER}/closed.h5 RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "a stopped generation's logits file:\n${err}")
endif()
file(REMOVE_RECURSE "${FOLDER}")
