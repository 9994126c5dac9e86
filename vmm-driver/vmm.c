typedef int vmm_placeholder;
