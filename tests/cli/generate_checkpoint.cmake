# cmake -DCOMMAND=<writescope> -DPYTHON=<python3 with h5py> -DFOLDER=<dir> -P generate_checkpoint.cmake
# make-checkpoint writes a synthetic checkpoint; generate from it must print the
# same tokens as generate from the same synthetic preset and seed.
# make_checkpoint([options]): a fresh tiny-qwen3-moe checkpoint of seed 7 in FOLDER.
function(make_checkpoint)
  file(REMOVE_RECURSE "${FOLDER}")
  execute_process(COMMAND ${COMMAND} make-checkpoint --model tiny-qwen3-moe --seed 7 --output ${FOLDER} ${ARGN}
    RESULT_VARIABLE status ERROR_VARIABLE err)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "make-checkpoint ${ARGN} failed (${status}): ${err}")
  endif()
endfunction()

make_checkpoint()
execute_process(COMMAND ${COMMAND} generate --model ${FOLDER} --prompt 3,1,4,1,5 --new-tokens 6
  RESULT_VARIABLE status OUTPUT_VARIABLE from_checkpoint ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "generate from the checkpoint failed (${status}): ${err}")
endif()
execute_process(COMMAND ${COMMAND} generate --model tiny-qwen3-moe --seed 7 --prompt 3,1,4,1,5 --new-tokens 6
  RESULT_VARIABLE status OUTPUT_VARIABLE synthetic ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "generate from the preset failed (${status}): ${err}")
endif()
if(NOT from_checkpoint STREQUAL synthetic OR NOT synthetic MATCHES "^[0-9]+( [0-9]+)+\n$")
  message(FATAL_ERROR "checkpoint generated '${from_checkpoint}', preset generated '${synthetic}'")
endif()
# The same checkpoint with transformers 5's config.json: the same tokens, and
# generate says which format it read.
make_checkpoint(--config-format transformers5)
execute_process(COMMAND ${COMMAND} generate --model ${FOLDER} --prompt 3,1,4,1,5 --new-tokens 6
  RESULT_VARIABLE status OUTPUT_VARIABLE from_v5 ERROR_VARIABLE err)
if(NOT status EQUAL 0 OR NOT from_v5 STREQUAL synthetic OR NOT err MATCHES "in the transformers-5 format: rope_theta")
  message(FATAL_ERROR "generate from the transformers 5 checkpoint (${status}) gave '${from_v5}': ${err}")
endif()
# Options of synthetic models are refused for a checkpoint: its weights are what they are.
execute_process(COMMAND ${COMMAND} generate --model ${FOLDER} --prompt 3 --new-tokens 2 --seed 7
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 2 OR NOT err MATCHES "generate: --layers, --hidden-scale and --seed apply to synthetic models, not to checkpoint")
  message(FATAL_ERROR "--seed with a checkpoint (${status}): ${err}")
endif()
# A logits file says which weights ran: the files with their sizes and times
# and what their own metadata says wrote them (a synthetic checkpoint's seed
# and build), the dtypes stored, and config.json itself (f16 and bf16 files of
# one seed give other logits).
make_checkpoint(--dtype f16)
execute_process(COMMAND ${COMMAND} generate --model ${FOLDER} --prompt 3,1 --new-tokens 2 --logits ${FOLDER}.h5
  RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "generate --logits from the f16 checkpoint failed (${status}): ${err}")
endif()
execute_process(COMMAND ${PYTHON} -c "
import sys, h5py
g = h5py.File(sys.argv[1], 'r')['generate_0']
print(g.attrs['weights_dtypes'], '|', g.attrs['weights_files'], '|', 'torch_dtype' in g.attrs['weights_config'])
" ${FOLDER}.h5 RESULT_VARIABLE status OUTPUT_VARIABLE described ERROR_VARIABLE err)
file(REMOVE ${FOLDER}.h5 ${FOLDER}.h5.lock)
if(NOT status EQUAL 0 OR NOT described MATCHES
   "^F16 [|] model.safetensors: [0-9]+ bytes, modified 20[0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9:]+Z \\(metadata: git_revision: [0-9a-f]+[a-z0-9-]*, model: tiny-qwen3-moe, seed: 7, writer: writescope make-checkpoint\\) [|] True")
  message(FATAL_ERROR "the logits file's weights (${status}): ${described}${err}")
endif()
# A damaged checkpoint is refused before a new logits file is made (no empty file left behind).
execute_process(COMMAND truncate -s -10 ${FOLDER}/model.safetensors)
execute_process(COMMAND ${COMMAND} generate --model ${FOLDER} --prompt 3,1 --new-tokens 2 --logits ${FOLDER}.h5
  RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR NOT err MATCHES "checkpoint error: .*model.safetensors: .*truncated" OR EXISTS ${FOLDER}.h5)
  message(FATAL_ERROR "generate --logits from a damaged checkpoint (${status}): ${err}")
endif()
file(REMOVE ${FOLDER}.h5.lock)
# A config.json whose sizes the weights do not have is that error, before
# anything is sized from it: two billion experts were listed tensor by tensor
# until memory ran out, and a larger vocabulary was blamed on --vram-budget.
foreach(edit "\"num_experts\": [0-9]+/\"num_experts\": 2000000000/model.layers.0.mlp.gate.weight' has shape [[][0-9]+, [0-9]+[]], where config.json's sizes give [[]2000000000, [0-9]+[]]"
             "\"vocab_size\": [0-9]+/\"vocab_size\": 100000000/model.embed_tokens.weight' has shape [[][0-9]+, [0-9]+[]], where config.json's sizes give [[]100000000, [0-9]+[]]")
  string(REPLACE "/" ";" parts "${edit}")
  list(GET parts 0 field)
  list(GET parts 1 value)
  list(GET parts 2 expected)
  make_checkpoint()
  file(READ ${FOLDER}/config.json json)
  string(REGEX REPLACE "${field}" "${value}" edited "${json}")
  file(WRITE ${FOLDER}/config.json "${edited}")
  execute_process(COMMAND ${COMMAND} generate --model ${FOLDER} --prompt 3,1 --new-tokens 2 TIMEOUT 60
    RESULT_VARIABLE status ERROR_VARIABLE err)
  if(NOT status EQUAL 1 OR NOT err MATCHES "checkpoint error: checkpoint .*: its config.json disagrees with its weights: tensor '${expected}")
    message(FATAL_ERROR "generate with ${value} in config.json (${status}): ${err}")
  endif()
endforeach()
file(REMOVE_RECURSE "${FOLDER}")
